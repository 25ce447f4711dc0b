"""The example configs a user starts from ship in the wheel, so that ``corrgrpo train
quickstart.yaml`` works from any folder of an installed package; the studies' own configs do not
ship (they live beside the studies, in ``studies/configs/``). The wheel claims one generic import
name, ``corrgrpo``: the trainer, agents and configs install under it, so a user's own
``trainer.py`` and ``agents.py`` beside their script shadow nothing of ours."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: a user's module under one of the generic names: it says so on stderr when imported (an error
#: could be swallowed by an optional import's ``except ImportError``)
SHADOW = "import sys\nsys.stderr.write('the user\\'s own {name}.py was imported\\n')\n"
SOURCES = ["pyproject.toml", "README.md", "corrgrpo", "corrgrpo_registry", "corrgrpo_envs",
           "corrgrpo_sandbox", "agents", "trainer", "env_configs"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built from a copy of its sources (the build writes beside them)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp / "dist"), str(src)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return next((tmp / "dist").glob("corrgrpo-*.whl"))


def test_the_wheel_holds_the_examples_and_not_the_studies_configs(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n for n in names if n.startswith("corrgrpo/env_configs/")}
    expected = {f"corrgrpo/env_configs/{p.relative_to(ROOT / 'env_configs').as_posix()}"
                for p in (ROOT / "env_configs").rglob("*.yaml")}
    assert {"corrgrpo/env_configs/quickstart.yaml", "corrgrpo/env_configs/accelerate/fsdp.yaml"} <= expected
    assert shipped == expected
    assert not any("studies" in n for n in names)


def test_the_wheel_claims_no_generic_top_level_name(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        recorded = [line.split(",")[0] for line in zf.read(record).decode().splitlines()]
    top = {n.split("/")[0] for n in recorded if "/" in n and ".dist-info/" not in n}
    assert top == {"corrgrpo", "corrgrpo_envs", "corrgrpo_registry", "corrgrpo_sandbox"}
    assert {"corrgrpo/trainer/cli.py", "corrgrpo/agents/policy.py", "corrgrpo/__init__.py"} <= set(recorded)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt")))
    assert b"corrgrpo = corrgrpo.trainer.cli:main" in entry_points


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_quickstart_by_name_from_any_folder_of_an_installed_wheel(wheel, tmp_path):
    site = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    # a training project's own modules beside its script, under the generic names ours once had:
    # the script's folder comes first on sys.path, and nothing of ours may resolve to them
    (work / "trainer.py").write_text(SHADOW.format(name="trainer"))
    (work / "agents.py").write_text(SHADOW.format(name="agents"))
    (work / "env_configs.py").write_text(SHADOW.format(name="env_configs"))
    # PYTHONPATH comes before the checkout's editable install: the wheel's code is what runs
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "100"}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *argv], cwd=work, env=env, capture_output=True,
                              text=True, timeout=580)

    where = run("-c", "import corrgrpo.trainer as t, corrgrpo.trainer.config as r; "
                      "print(t.__file__); print(r.resolve_config_path('quickstart.yaml'))")
    assert where.returncode == 0, where.stderr
    module, config = where.stdout.split()
    configs = site / "corrgrpo" / "env_configs"
    assert Path(module).is_relative_to(site) and Path(config) == configs / "quickstart.yaml"

    missing = run("-m", "corrgrpo.trainer.cli", "train", "no_such_config.yaml")
    assert missing.returncode == 2
    assert "no_such_config.yaml" in missing.stderr and str(configs) in missing.stderr

    trained = run("-m", "corrgrpo.trainer.cli", "train", "quickstart.yaml", "train.steps=1",
                  "algorithm.prompts_per_step=2", "algorithm.group_size=2", "rollout.max_new_tokens=8",
                  "train.progress=false", "train.report_to=none", "train.output_dir=run")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "was imported" not in where.stderr + missing.stderr + trained.stderr
    steps = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1] and "reward/digits/mean" in steps[0]
