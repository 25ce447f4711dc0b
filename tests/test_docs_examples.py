"""The getting-started pages' code runs: every file of ``docs/tutorials/`` that a page includes.

Each script runs in a fresh folder holding a copy of ``docs/tutorials/``, with this
interpreter's ``corrgrpo`` and ``python`` first on ``PATH``, so the example configs are found
the way a user's are (by file name, from the installed package). Training commands are the
pages' own, shortened: :data:`FAST_TRAIN` and :data:`FAST_SFT` are appended to each ``corrgrpo
train`` and ``corrgrpo sft`` (later overrides win), :data:`FAST_EVAL` to each ``corrgrpo eval``,
a checkpoint named by its step is the shortened run's last one, and ``--limit`` evaluates a
few tasks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TUTORIALS = DOCS / "tutorials"

FAST_STEPS = 2
FAST_TRAIN = (f"train.steps={FAST_STEPS} algorithm.prompts_per_step=2 algorithm.group_size=4 "
              "rollout.max_new_tokens=12 train.progress=false train.report_to=none")
FAST_EVAL = "rollout.max_new_tokens=12"
FAST_SFT = (f"train.steps={FAST_STEPS} train.batch_size=1 data.max_examples=4 "
            "data.max_eval_examples=1 train.eval_every=1 train.progress=false train.report_to=none")


def shortened(script: str) -> str:
    """``script`` with its training commands shortened (see the module's docstring)."""
    def fast(match: re.Match[str]) -> str:
        extra = {"sft": FAST_SFT, "train": FAST_TRAIN, "eval": FAST_EVAL}[match.group("cmd")]
        command = match.group(0).rstrip()
        return f"{command} {extra}{match.group(0)[len(command):]}"

    script = re.sub(r"corrgrpo (?P<cmd>train|sft|eval) [^#\n;&|]*", fast, script)
    script = re.sub(r"checkpoint-\d+", f"checkpoint-{FAST_STEPS}", script)
    return re.sub(r"--limit \d+", "--limit 2", script)


def run_tutorial(name: str, cwd: Path, timeout: float, replace: dict[str, str] | None = None) -> str:
    """Run ``docs/tutorials/NAME`` (``.sh`` under bash -e, ``.py`` under this interpreter) in
    ``cwd``; its stdout and stderr, or a failure showing them."""
    text = (TUTORIALS / name).read_text(encoding="utf-8")
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "COLUMNS": "100", "PYTHONPATH": str(cwd)}
    if name.endswith(".sh"):
        argv = ["bash", "-e", "-c", shortened(text)]
    else:
        argv = [sys.executable, "-c", text]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{output[-4000:]}"
    return output


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copytree(TUTORIALS, tmp_path / "tutorial")
    return tmp_path / "tutorial"


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_every_tutorial_file_is_included_by_a_page():
    pages = "\n".join(p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md"))
    included = {name for name in re.findall(r'--8<-- "([^"]+)"', pages) if "/" not in name}
    files = {p.name for p in TUTORIALS.iterdir() if p.is_file()}
    assert files - included == set(), "files no page shows"
    assert included - files == set(), "pages include files that are not there"


def test_shortened_appends_overrides_and_keeps_comments():
    script = ("corrgrpo train quickstart.yaml a.b=1   # note\n"
              "for s in 0 1; do corrgrpo train x.yaml train.seed=$s; done\n"
              "corrgrpo eval x.yaml --checkpoint runs/r/checkpoint-30 --limit 50\n")
    out = shortened(script).splitlines()
    assert out[0] == f"corrgrpo train quickstart.yaml a.b=1 {FAST_TRAIN}   # note"
    assert out[1] == f"for s in 0 1; do corrgrpo train x.yaml train.seed=$s {FAST_TRAIN}; done"
    assert out[2] == f"corrgrpo eval x.yaml --checkpoint runs/r/checkpoint-{FAST_STEPS} --limit 2 {FAST_EVAL}"


# ------------------------------------------------------------------ the pages, in order
def test_install_first_commands(workdir):
    out = run_tutorial("first_commands.sh", workdir, timeout=300)
    assert "corrgrpo/ScaleDominance-v0" in out and "corrgrpo/ToolCall-v0" in out  # envs list
    assert "CorrGRPO" in out and "c_q" in out  # the worked example
    assert "settings (every one optional; [default]):" in out or "usage: corrgrpo train" in out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quickstart_trains_plots_advises_and_reads_its_metrics(workdir):
    out = run_tutorial("quickstart.sh", workdir, timeout=600)
    corr, grpo = workdir / "runs" / "quickstart-corrgrpo-s0", workdir / "runs" / "quickstart-grpo-s1"
    for run in (corr, grpo):
        steps = _metrics(run)
        assert [s["step"] for s in steps] == list(range(1, FAST_STEPS + 1))
    assert json.loads((corr / "config.json").read_text())["algorithm"]["estimator"] == "corrgrpo"
    assert list(workdir.rglob("*.png")), f"no plot written:\n{out[-2000:]}"
    printed = run_tutorial("read_metrics.py", workdir, timeout=120)
    assert printed.count("step 1:") == 7 and "c_q/median" in printed
    _assert_metrics_documented(_metrics(corr))


def _assert_metrics_documented(steps: list[dict]) -> None:
    """Every key a run logged is on the metrics reference page (``<component>`` and the like
    stand for any name)."""
    page = (DOCS / "reference" / "metrics.md").read_text(encoding="utf-8")
    patterns = [re.compile(re.sub(r"<[a-z_]+>", "[^/]+", re.escape(written)))
                for written in re.findall(r"`([a-z0-9_/<>]+)`", page)]
    keys = {k for s in steps for k in s}
    missing = sorted(k for k in keys if not any(p.fullmatch(k) for p in patterns))
    assert missing == [], f"logged but not on docs/reference/metrics.md: {missing}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_your_own_env_checks_trains_and_evaluates(workdir):
    out = run_tutorial("check_polite.py", workdir, timeout=300)
    assert "Say hello to" in out and "('polite', 'brief') [1. 1.]" in out
    assert "check_env: passed" in out
    out = run_tutorial("polite.sh", workdir, timeout=600)
    reference = json.loads(next((workdir / "runs").glob("polite-eval/eval-all-reference.json")).read_text())
    assert reference["metrics"]["polite"] == 1.0 and reference["metrics"]["brief"] == 1.0
    run = workdir / "runs" / "polite-corrgrpo-s0"
    assert len(_metrics(run)) == FAST_STEPS
    # the page's promise: brief is graded, so the run has something to learn from its first step
    assert all(r["reward/brief/mean"] > 0.3 for r in _metrics(run)) and "every reward is 0" not in out
    assert list((run / f"checkpoint-{FAST_STEPS}").glob("eval-all-*.json")), out[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_on_an_openenv_server(workdir):
    if importlib.util.find_spec("openenv") is None:
        pytest.skip("openenv is not installed (pip install -e '.[openenv]' and openenv --no-deps)")
    port = str(free_port())  # the page's port 8000 may be taken: the script and its config move
    (workdir / "remote.yaml").write_text((workdir / "remote.yaml").read_text().replace("8000", port))
    run_tutorial("openenv.sh", workdir, timeout=600, replace={"8000": port})
    steps = _metrics(workdir / "runs" / "remote-corrgrpo-s0")
    assert len(steps) == FAST_STEPS and "reward/digits/mean" in steps[0]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compare_estimators(workdir):
    # one seed of the page's three: each run is a process start (torch, transformers) and a
    # training; compare.py's spread over one seed is 0
    out = run_tutorial("compare.sh", workdir, timeout=900, replace={"0 1 2": "0"})
    for estimator in ("grpo", "corrgrpo", "gdpo"):
        for seed in (0,):
            assert len(_metrics(workdir / "runs" / f"quickstart-{estimator}-s{seed}")) == FAST_STEPS
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if re.match(r"estimator +weighted +digits", line))
    rows = [line.split() for line in lines[header + 1:header + 4]]
    assert [row[0] for row in rows] == ["grpo", "corrgrpo", "gdpo"]
    assert all(len(row) == 1 + 2 * 4 and row[2].startswith("±") for row in rows)  # mean ±spread x 4


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sft_then_rl_a_small_model(workdir):
    # the page's pipeline on the tiny model: SmolLM2 in each of the page's four processes cost
    # 80 s of the suite; its weights load and train in tests/test_agents_models.py
    run_tutorial("sft_then_rl.sh", workdir, timeout=900,
                 replace={"sft_smollm2.yaml": "sft_smollm2.yaml model.name_or_path=tiny"})
    assert (workdir / "runs" / "sft" / "model" / "config.json").is_file()
    assert len(_metrics(workdir / "runs" / "rl")) == FAST_STEPS
    assert list((workdir / "runs" / "rl" / f"checkpoint-{FAST_STEPS}").glob("eval-eval-model.json"))
