"""Generation throughput: HFPolicy's static-cache decode loop against transformers ``generate``,
each with and without the group's prompt prefilled once (``HFPolicy(share_prompts=...)``).

    python -m bench.generation                          # anchor setting: tiny-anchor, 8 x 8 rollouts, 64 tokens
    python -m bench.generation --models tiny-anchor,tiny,smollm2-135m --batch 64
    python -m bench.generation --models smollm2-135m --prompts toolcall-long --batch 8 \
        --new-tokens 32 --contenders static,static+shared --baseline static --repeats 2 --rounds 2
    .venv-vllm/bin/python -m bench.generation --vllm    # also VLLMPolicy (vLLM CPU)
    .venv-vllm/bin/python -m bench.generation --models smollm2-135m --prompts toolcall-long --batch 8 \
        --new-tokens 32 --contenders static,static+shared,vllm,vllm-noprefix --baseline static

Contenders: ``generate`` and ``static`` (each prompt prefilled once per row),
``generate+shared`` and ``static+shared`` (each distinct prompt
prefilled once; ``generate`` copies its key/value cache to the G rows of its group, the static
loop reads one copy per group at each decode step), ``static+copied`` (the static loop copying
the cache to the rows instead, as before its cascade attention; prompts under
``corrgrpo.agents.hf_policy.MIN_SHARED_PROMPT`` tokens, such as the anchor's, are not shared), ``vllm``
(prefix caching on, as the trainer builds it) and ``vllm-noprefix`` (off). Every contender's
speed is printed as a ratio to ``--baseline``'s, side by side, and each shared contender's as a
ratio to its unshared twin.

``--prompts toolcall-long`` is the long-prompt setting: RLLA-layout tool-call prompts (the
ToolCall env's generated tasks, seed 0, system prompt with the tool list) of 740-820 tokens
in the model's chat template, about 780; ``anchor`` (default) the anchor's short prompts.

Each round is a fresh process with an explicit torch thread count (``--threads``)
that builds the model once and times the contenders batch by batch in alternation
(the order flips every batch), so the machine's drifting load hits them alike; after
one warm-up batch each, ``--repeats`` batches per contender give a median, and the
ratio of each contender's median to the baseline's is the round's. The median (and range)
over rounds is printed. Tokens counted are the completion tokens generated (EOS
included). The HF contenders draw the same tokens for the same seed (checked here:
their token counts must match the baseline's batch for batch).

The anchor setting is the TRL comparison's (``bench/vs_trl.py``): the anchor's
random-init Qwen2 (558,208 parameters) and tokenizer, a batch of G x P = 8 x 8
rollouts of its prompts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONTENDERS = ("generate", "static", "generate+shared", "static+shared", "static+copied", "vllm", "vllm-noprefix")
DEFAULT_CONTENDERS = "generate,static,static+shared"
PROMPT_SETTINGS = ("anchor", "toolcall-long")
#: The long-prompt setting's prompt length window (tokens of the rendered first turn).
LONG_PROMPT_TOKENS = (740, 820)


def _prompts(batch: int, group: int, setting: str = "anchor", tokenizer=None) -> list[dict]:
    """``batch // group`` prompts of ``setting``, each repeated ``group`` times (one group each)."""
    tasks = max(1, batch // group)
    if setting == "toolcall-long":
        messages = _long_toolcall_messages(tasks, tokenizer)
    else:
        messages = [[{"role": "user", "content": f"write a short string: {k}"}] for k in range(tasks)]
    return [{"messages": m} for m in messages for _ in range(group)][:batch]


def _long_toolcall_messages(count: int, tokenizer) -> list[list[dict]]:
    """The first ``count`` generated ToolCall tasks (seed 0, RLLA system prompt) whose rendered
    prompt has ``LONG_PROMPT_TOKENS`` tokens."""
    from corrgrpo.agents.chat import ChatRenderer
    from corrgrpo_envs.toolcall.generator import generate_task

    renderer = ChatRenderer(tokenizer)
    low, high = LONG_PROMPT_TOKENS
    found = []
    for index in range(5000):
        messages = generate_task(0, index)["messages"]
        if low <= len(renderer.first_prompt({"messages": messages})) <= high:
            found.append(messages)
            if len(found) == count:
                return found
    raise SystemExit(f"toolcall-long: only {len(found)} of {count} generated tasks have {low}-{high} prompt tokens")


def _policy(contender: str, model, tokenizer):
    from corrgrpo.agents import HFPolicy

    if not contender.startswith("vllm"):
        decoder, _, shared = contender.partition("+")
        return HFPolicy(model, tokenizer, decoder=decoder, share_prompts=shared in ("shared", "copied"))
    from corrgrpo.agents import VLLMPolicy

    folder = Path(tempfile.mkdtemp(prefix="bench-gen-"))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # "vllm" is VLLMPolicy as the trainer builds it (prefix caching on); "vllm-noprefix" turns the
    # cache off, the baseline that shows what the group's shared prompt saves there
    return VLLMPolicy(str(folder), tokenizer=tokenizer, dtype="float32", max_model_len=2048,
                      enforce_eager=True, gpu_memory_utilization=0.15,
                      enable_prefix_caching=contender == "vllm")


@contextlib.contextmanager
def _copied_prompt_caches(active: bool):
    """``static+copied``: the static loop shares the prefill but copies each prompt's cache to
    its rows, as it did before cascade attention (every group counted as unequal)."""
    if not active:
        yield
        return
    import corrgrpo.agents.static_decode as decode

    equal_groups = decode.equal_groups
    decode.equal_groups = lambda inverse, groups: False
    try:
        yield
    finally:
        decode.equal_groups = equal_groups


def child(contenders: list[str], model_name: str, batch: int, group: int, new_tokens: int, repeats: int,
          threads: int, out: str, setting: str = "anchor") -> None:
    import torch

    torch.set_num_threads(threads)
    from corrgrpo.agents import SamplingParams, load_model

    model, tokenizer = load_model(model_name)
    policies = {c: _policy(c, model, tokenizer) for c in contenders}
    observations = _prompts(batch, group, setting, tokenizer)
    prompt_tokens = [len(p) for p in policies[contenders[0]].prompt_ids(observations, None)] \
        if not contenders[0].startswith("vllm") else []
    rates: dict[str, list[float]] = {c: [] for c in contenders}
    tokens: dict[str, list[int]] = {c: [] for c in contenders}
    seconds: dict[str, list[float]] = {c: [] for c in contenders}
    for r in range(repeats + 1):
        sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=r)
        for c in contenders if r % 2 == 0 else contenders[::-1]:
            if c.startswith("vllm"):
                # every batch repeats the same prompts; in training each step's are new (and the
                # weights change, which resets the cache), so no batch may reuse an earlier one's
                policies[c].llm.reset_prefix_cache()
            with _copied_prompt_caches(c == "static+copied"):
                start = time.perf_counter()
                actions = policies[c].act(observations, sampling)
                elapsed = time.perf_counter() - start
            n = sum(len(a.completion_ids) for a in actions)
            if r:  # the first batch warms caches
                rates[c].append(n / elapsed)
                tokens[c].append(n)
                seconds[c].append(elapsed)
    Path(out).write_text(json.dumps({
        c: {"tokens_per_s": statistics.median(rates[c]), "seconds": statistics.median(seconds[c]),
            "tokens": tokens[c], "prompt_tokens": prompt_tokens} for c in contenders
    }))


def _run_round(contenders: list[str], model: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        # two vLLM engines in one process each reserve VLLM_CPU_KVCACHE_SPACE GiB (by default
        # much of the RAM); 1 GiB holds a batch of 64 x 2048 tokens of SmolLM2 many times
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", **os.environ, "TOKENIZERS_PARALLELISM": "false",
               "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        cmd = [sys.executable, "-m", "bench.generation", "--child", ",".join(contenders), "--models", model,
               "--batch", str(args.batch), "--group", str(args.group), "--new-tokens", str(args.new_tokens),
               "--repeats", str(args.repeats), "--threads", str(args.threads), "--out", str(out),
               "--prompts", args.prompts]
        subprocess.run(cmd, check=True, cwd=ROOT, env=env, timeout=1800)
        return json.loads(out.read_text())


def versions() -> dict[str, str]:
    import importlib.metadata as md

    found = {}
    for name in ("torch", "transformers", "accelerate", "vllm"):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-anchor")
    parser.add_argument("--batch", type=int, default=64, help="rollouts per call (G x P)")
    parser.add_argument("--group", type=int, default=8, help="G: rollouts per prompt")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each process")
    parser.add_argument("--vllm", action="store_true", help="also VLLMPolicy (needs vLLM)")
    parser.add_argument("--contenders", default=DEFAULT_CONTENDERS,
                        help=f"comma-separated, of: {', '.join(CONTENDERS)}")
    parser.add_argument("--baseline", default="generate", help="the contender every ratio is taken against")
    parser.add_argument("--prompts", default="anchor", choices=PROMPT_SETTINGS,
                        help="anchor: short prompts; toolcall-long: RLLA tool-call prompts of about 780 tokens")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from bench.versions import format_versions, interpreter_versions  # bench/versions.py
    if not args.child:
        print(format_versions("versions", interpreter_versions()), flush=True)
    if args.child:
        child(args.child.split(","), args.models, args.batch, args.group, args.new_tokens, args.repeats,
              args.threads, args.out, args.prompts)
        return 0

    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    if args.vllm and "vllm" not in contenders:
        contenders.append("vllm")
    unknown = [c for c in contenders if c not in CONTENDERS]
    if unknown or not contenders:
        parser.error(f"--contenders: {', '.join(unknown) or 'none given'} not among {', '.join(CONTENDERS)}")
    if args.baseline not in contenders:
        parser.error(f"--baseline {args.baseline!r} is not among --contenders {', '.join(contenders)}")
    load_before = os.getloadavg()
    print(f"batch {args.batch} (G={args.group}) x {args.new_tokens} new tokens, {args.prompts} prompts, "
          f"{args.threads} torch thread(s), median of {args.repeats} batches per contender and process, "
          f"{args.rounds} rounds; load average {load_before[0]:.1f}; {versions()}", flush=True)
    report: dict[str, dict] = {}
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        runs: dict[str, list[dict]] = {c: [] for c in contenders}
        for _ in range(args.rounds):
            result = _run_round(contenders, model, args)
            for contender in contenders:
                runs[contender].append(result[contender])
        base = runs[args.baseline]
        for c in contenders:
            if not c.startswith("vllm") and any(b["tokens"] != r["tokens"] for b, r in zip(base, runs[c])):
                print(f"warning: {model}: {args.baseline} and {c} drew different token counts "
                      f"{[b['tokens'] for b in base]} / {[r['tokens'] for r in runs[c]]}")
        row: dict[str, dict] = {}
        for c, rs in runs.items():
            ratios = [r["tokens_per_s"] / b["tokens_per_s"] for b, r in zip(base, rs)]
            row[c] = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs),
                      "seconds_per_batch": statistics.median(r["seconds"] for r in rs),
                      "rounds": [r["tokens_per_s"] for r in rs],
                      "over_baseline": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}}
        prompt_tokens = base[0].get("prompt_tokens") or []
        if prompt_tokens:
            row["prompt_tokens"] = {"mean": statistics.mean(prompt_tokens), "min": min(prompt_tokens),
                                    "max": max(prompt_tokens)}
            print(f"{model:<14} prompts of {min(prompt_tokens)}-{max(prompt_tokens)} tokens "
                  f"(mean {statistics.mean(prompt_tokens):.0f})")
        report[model] = row
        for c in contenders:
            r = row[c]["over_baseline"]
            print(f"{model:<14} {c:<16} {row[c]['tokens_per_s']:>9.1f} tokens/s  {row[c]['seconds_per_batch']:8.3f} "
                  f"s/batch  {r['median']:5.2f}x {args.baseline} (rounds {r['min']:.2f}-{r['max']:.2f})", flush=True)
        for decoder, unshared, shared in (("generate", "generate", "generate+shared"),
                                          ("static", "static", "static+shared"),
                                          ("static_copied", "static", "static+copied"),
                                          ("vllm", "vllm-noprefix", "vllm")):
            if unshared in runs and shared in runs:
                ratios = [s["tokens_per_s"] / u["tokens_per_s"] for u, s in zip(runs[unshared], runs[shared])]
                row[f"{decoder}_shared_over_unshared"] = {"median": statistics.median(ratios), "min": min(ratios),
                                                          "max": max(ratios)}
                print(f"{model:<14} {decoder}: shared prompt / unshared: {statistics.median(ratios):.2f}x "
                      f"(rounds {min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": report, "load_average": [load_before[0], load_after[0]],
                                               "versions": versions(), "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
