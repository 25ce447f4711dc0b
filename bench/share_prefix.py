"""``optim.share_prefix`` against the plain pass: one forward and backward pass over a group.

    python -m bench.share_prefix                      # SmolLM2-135M, 8 answers of 110 tokens, 780-token prompt
    python -m bench.share_prefix --model tiny --rounds 5 --prompt 400 --answer 60

A group of ``--group`` answers of ``--answer`` tokens to one prompt of ``--prompt`` tokens (random
token ids: the cost does not depend on them) goes through ``corrgrpo.trainer.policy_forward.token_logprobs``
and a backward pass, plainly and with ``share_prefix=True``, alternating round by round in one
process with ``--threads`` torch threads (set explicitly). Prints each round's seconds, the median
of each side, the ratio plain / shared, and the largest log-probability difference between them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="corrgrpo.agents.load_model name or path")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=780)
    parser.add_argument("--answer", type=int, default=110)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from bench.versions import format_versions, interpreter_versions
    from corrgrpo.agents import load_model
    from corrgrpo.trainer.policy_forward import PackedBatch, token_logprobs

    print(format_versions("versions", interpreter_versions()), flush=True)
    model, _ = load_model(args.model)
    model.float()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    g, p, a = args.group, args.prompt, args.answer
    ids = torch.cat([torch.randint(5, vocab, (1, p), generator=gen).repeat(g, 1),
                     torch.randint(5, vocab, (g, a), generator=gen)], 1)
    mask = torch.zeros(g, p + a - 1)
    mask[:, p - 1:] = 1
    batch = PackedBatch(ids, torch.ones_like(ids), mask, torch.zeros_like(mask))
    print(f"{args.model}: {g} answers of {a} tokens to one {p}-token prompt; {args.threads} torch thread(s); "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    seconds: dict[bool, list[float]] = {False: [], True: []}
    logps: dict[bool, torch.Tensor] = {}
    for r in range(args.rounds):
        for share in (False, True) if r % 2 == 0 else (True, False):
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            logp, _ = token_logprobs(model, batch, share_prefix=share)
            (logp * mask).sum().backward()
            seconds[share].append(time.perf_counter() - t0)
            logps[share] = logp.detach()
            print(f"round {r + 1}: {'shared' if share else 'plain '} {seconds[share][-1]:.2f} s", flush=True)
    plain, shared = statistics.median(seconds[False]), statistics.median(seconds[True])
    diff = float(((logps[True] - logps[False]) * mask).abs().max())
    print(f"plain {plain:.2f} s, shared {shared:.2f} s: shared is {plain / shared:.2f}x the plain pass's speed; "
          f"largest log-prob difference {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
