"""Configs that cannot explode: any config file is one error line within 1 s and 100 MB.

A config may come from anywhere. Before the bounds of :mod:`corrgrpo_registry.yaml_files`, an
812-byte file of nested aliases (nine mappings, each naming the one before nine times) made the
key-line index follow every alias path: ``corrgrpo train``, ``eval``, ``sft`` and ``sweep`` each
spent 20-26 s of CPU and 2.2 GB before a MemoryError traceback; 10,000 nested brackets ended in a
RecursionError traceback. Here every bomb runs through every command that reads a config, as a
subprocess, whose CPU time and peak RSS come from ``wait4``; each must print one ``error:`` line
naming the file and exit with status 2, without a traceback. A command's own start (imports)
costs about 0.3-0.6 s of CPU and 50-60 MB here, measured on a one-line bad config beside each.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from cpu_budget import cpu_seconds

from corrgrpo_registry.settings import ConfigError
from corrgrpo_registry.yaml_files import (
    MAX_YAML_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    key_lines,
    load_json,
    load_yaml,
    load_yaml_text,
    load_yaml_with_lines,
)

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["train", "eval", "sft", "sweep"]
#: What one command may cost on any config: CPU seconds and peak RSS.
MAX_SECONDS = 1.0
MAX_RSS_MB = 100
#: What the bomb may add to the command's start, measured on a one-line bad config.
MAX_EXTRA_SECONDS = 0.5


def billion_laughs() -> str:
    """Nine mappings, each naming the one before nine times: 812 bytes, 9^9 nodes expanded."""
    lines = ["a0: &a0 {x: 1, y: 2, z: 3, w: 4, v: 5, u: 6, t: 7, s: 8, r: 9}"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} {{" + ", ".join(f"{k}: *a{i - 1}" for k in "abcdefghi") + "}")
    return "\n".join(lines) + "\ntrain: {steps: *a9}\n"


def merge_laughs() -> str:
    """The same through merge keys: each mapping merges the one before nine times."""
    lines = ["a0: &a0 {x: 1, y: 2}"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} {{<<: [" + ", ".join([f"*a{i - 1}"] * 9) + f"], k{i}: 1}}")
    return "\n".join(lines) + "\n"


#: name -> (file text, or None for a 200 MB file, what the error line says)
BOMBS = {
    "nested aliases": (billion_laughs(), "more than 5,000 YAML nodes"),
    "nested aliases of lists": ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"b{i}: &b{i} [" + ", ".join([f"*{'a' if i == 0 else f'b{i - 1}'}"] * 9) + "]\n"
        for i in range(9)), "more than 5,000 YAML nodes"),
    "an alias inside what it names": ("train: &r {x: *r}\n", "alias *r is inside the node it names"),
    "10,000 nested lists": ("train: " + "[" * 10_000 + "]" * 10_000 + "\n", "nested more than 64 levels"),
    "10,000 nested maps": ("train: " + "{a: " * 10_000 + "1" + "}" * 10_000 + "\n", "nested more than 64 levels"),
    "a 200 MB string": (None, "larger than 128 KiB"),
}


def _write(folder: Path, name: str, text: str | None) -> Path:
    path = folder / (name.replace(" ", "_").replace(",", "") + ".yaml")
    if text is None:  # a string of 200 MB: its opening, then a sparse rest
        with path.open("w") as handle:
            handle.write("name: '")
            handle.truncate(200 << 20)
    else:
        path.write_text(text)
    return path


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a regression must not take the machine


#: Runs ``python -m corrgrpo.trainer.cli ARGV`` and, however it ends, writes the process's peak RSS (its
#: own address space's high-water mark, VmHWM) to the file named by CORRGRPO_PEAK_RSS_FILE. The
#: rusage of a child is no measure: Linux counts into a child's ru_maxrss the high-water mark of
#: the process it was forked from, so every command run from a large test worker "peaked" at the
#: worker's size (880 MB in a full suite run).
_REPORT_PEAK = """
import os, runpy, sys
def peak():
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    with open(os.environ["CORRGRPO_PEAK_RSS_FILE"], "w") as f:
        f.write(str(kb))
sys.argv = ["corrgrpo.trainer.cli", *sys.argv[1:]]
try:
    runpy.run_module("corrgrpo.trainer.cli", run_name="__main__", alter_sys=True)
finally:
    peak()
"""


def run_command(argv: list[str]) -> tuple[int, list[str], float, float]:
    """``(exit status, output lines, CPU seconds, peak RSS in MB)`` of ``python -m corrgrpo.trainer.cli argv``."""
    with tempfile.NamedTemporaryFile(suffix=".rss") as peak_file:
        env = dict(os.environ, PYTHONPATH=str(ROOT), CORRGRPO_PEAK_RSS_FILE=peak_file.name)
        process = subprocess.Popen([sys.executable, "-c", _REPORT_PEAK, *argv], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_limit_memory)
        timer = threading.Timer(120, process.kill)
        timer.start()
        try:
            out = process.stdout.read()
            _, status, usage = os.wait4(process.pid, 0)
        finally:
            timer.cancel()
            process.stdout.close()
        text = Path(peak_file.name).read_text().strip()
    process.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    # no report: the process was killed before its finally block ran, a failure whatever its size
    peak_mb = int(text) / 1024 if text else float("inf")
    return process.returncode, lines, usage.ru_utime + usage.ru_stime, peak_mb


def _argv(command: str, config: Path, tmp_path: Path) -> list[str]:
    if command == "sweep":
        return ["sweep", str(config), "--weights", "simplex:2", "--seeds", "1", "--out", str(tmp_path / "sweep")]
    return [command, str(config)]


@pytest.fixture(scope="module")
def baselines(tmp_path_factory) -> dict[str, tuple[float, float]]:
    """Each command's CPU seconds and peak RSS on a one-line bad config (its start's cost)."""
    folder = tmp_path_factory.mktemp("baseline")
    config = folder / "bad.yaml"
    config.write_text("train: {steps: -1}\n")
    out = {}
    for command in COMMANDS:
        status, lines, seconds, rss = run_command(_argv(command, config, folder))
        assert status == 2 and len(lines) == 1 and "train.steps" in lines[0], lines
        out[command] = (seconds, rss)
    return out


def check_one_line(status: int, lines: list[str], path: Path, says: str) -> None:
    assert status == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and str(path) in lines[0] and says in lines[0], lines[0]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("bomb", list(BOMBS))
def test_every_command_reports_a_bomb_in_one_line(baselines, tmp_path, command, bomb):
    text, says = BOMBS[bomb]
    path = _write(tmp_path, bomb, text)
    status, lines, seconds, rss = run_command(_argv(command, path, tmp_path))
    check_one_line(status, lines, path, says)
    start_seconds, start_rss = baselines[command]
    assert seconds < max(MAX_SECONDS, start_seconds + MAX_EXTRA_SECONDS), (seconds, start_seconds)
    assert rss < MAX_RSS_MB, (rss, start_rss)


@pytest.mark.parametrize("name, text, says", [
    ("nested_aliases.yaml", billion_laughs().replace("train: {steps: *a9}", "- *a9"), "more than 5,000"),
    ("deep.json", "[" * 60_000 + "]" * 60_000, "nested too deeply"),
    ("deep.yaml", "[" * 50_000, "nested more than 64 levels"),
])
def test_sweep_reports_a_bad_weights_file_before_building_anything(baselines, tmp_path, name, text, says):
    path = tmp_path / name
    path.write_text(text)
    status, lines, seconds, rss = run_command(
        ["sweep", str(ROOT / "env_configs" / "sweep_toy.yaml"), "--weights", str(path), "--seeds", "1",
         "--out", str(tmp_path / "sweep")])
    check_one_line(status, lines, path, says)
    assert seconds < max(MAX_SECONDS, baselines["sweep"][0] + MAX_EXTRA_SECONDS) and rss < MAX_RSS_MB


def test_an_override_is_bounded_too(baselines, tmp_path):
    bomb = "[" + ", ".join(["&a [x, x, x, x, x, x, x, x]"] + ["*a"] * 800) + "]"
    status, lines, seconds, rss = run_command(["train", "quickstart.yaml", f"env.x={bomb}"])
    assert status == 2 and len(lines) == 1 and "override 'env.x=" in lines[0] and "more than 5,000" in lines[0]
    assert seconds < max(MAX_SECONDS, baselines["train"][0] + MAX_EXTRA_SECONDS) and rss < MAX_RSS_MB


# ------------------------------------------------------------------------ the reader itself
@pytest.mark.parametrize("text, says", [
    (billion_laughs(), "more than 5,000 YAML nodes"),
    (merge_laughs(), "more than 5,000 YAML nodes"),
    ("s: &s '" + "a" * 100_000 + "'\nx: [" + ", ".join(["*s"] * 100) + "]\n", "more than 5,000 YAML nodes"),
    ("x: [" + "a, " * 20_000 + "]\n", "more than 5,000 YAML nodes"),
    ("".join(f"k{i}: 1\n" for i in range(6_000)), "more than 5,000 YAML nodes"),
    ("".join(" " * i + "a:\n" for i in range(80)) + " " * 80 + "b: 1\n", "nested more than 64 levels"),
    ("- " * 5_000 + "x\n", "nested more than 64 levels"),
    ("x: &a [*a]\n", "alias *a is inside the node it names"),
    ("x: *nowhere\n", "not valid YAML"),
    ("a: 1\na: 2\n", "duplicate key 'a'"),
])
def test_a_bomb_is_one_config_error_within_a_bounded_cost(text, says):
    with pytest.raises(ConfigError, match=re.escape(says)) as caught:
        load_yaml_text(text, "bomb.yaml")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("bomb.yaml")
    _, seconds = cpu_seconds(lambda: pytest.raises(ConfigError, load_yaml_text, text, "bomb.yaml"))
    assert seconds < 0.5, seconds


def test_the_bounds_leave_real_configs_alone():
    for path in sorted((ROOT / "env_configs").glob("*.yaml")) + sorted((ROOT / "studies" / "configs").glob("*.yaml")):
        data, lines = load_yaml_with_lines(path)
        assert data == load_yaml(path) and lines == key_lines(path)
    assert MAX_YAML_BYTES == 128 * 1024 and MAX_YAML_NODES == 5_000 and MAX_YAML_DEPTH == 64


def test_aliases_are_read_and_indexed_once(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("base: &b\n  lr: 1\n  steps: [2, 3]\nfirst: *b\nsecond: [*b, *b]\n")
    data, lines = load_yaml_with_lines(path)
    assert data == {"base": {"lr": 1, "steps": [2, 3]}, "first": {"lr": 1, "steps": [2, 3]},
                    "second": [{"lr": 1, "steps": [2, 3]}] * 2}
    assert data["first"] is data["base"]  # one object, however many aliases name it
    # the aliased mapping's keys keep their first path; an error under first.* names first's line
    assert lines == {"base": 1, "base.lr": 2, "base.steps": 3, "first": 4, "second": 5}


def test_a_json_file_is_bounded_like_a_yaml_one(tmp_path):
    path = tmp_path / "w.json"
    path.write_text("[[1, 0], [0, 1]]")
    assert load_json(path) == [[1, 0], [0, 1]]
    path.write_text("[" * 100)
    with pytest.raises(ConfigError, match=r"w.json: not valid JSON"):
        load_json(path)
    path.write_text(" " * (MAX_YAML_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than 128 KiB"):
        load_json(path)


def test_a_200_mb_file_is_refused_without_being_read(tmp_path):
    path = _write(tmp_path, "huge", None)
    start = time.process_time()
    with pytest.raises(ConfigError, match="larger than 128 KiB"):
        load_yaml(path)
    assert time.process_time() - start < 0.1
