"""What a new user meets in the first hour: install hints and user text printed as they are
(not eaten as rich markup), an override's typo blamed on the override, advice that follows the
direction of its number and names repeated components once, a warning when every reward is 0,
and ``env.import`` for an id that a user module registers."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
from rich.console import Console

import corrgrpo_envs
from corrgrpo.trainer.advice import ADVICE, advise
from corrgrpo.trainer.cli import main
from corrgrpo.trainer.config import ConfigError, load_config
from corrgrpo.trainer.zero_rewards import ZeroRewardWatch
from corrgrpo_envs import commands as envs_commands
from corrgrpo_envs.registry import ENVS

AGENTDOJO_HINT = "pip install 'corrgrpo[agentdojo]'"


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich tables: no wrapping to judge the text itself


# ------------------------------------------------------- (a) text is not markup
def test_envs_list_prints_the_install_hint_with_its_extra(monkeypatch, capsys):
    def unavailable(env_id):
        exc = ModuleNotFoundError("No module named 'agentdojo'", name="agentdojo")
        return {"id": env_id, "description": "", "error": "missing dependency: agentdojo",
                "hint": envs_commands.install_hint(exc)}

    monkeypatch.setattr(envs_commands, "describe_env", unavailable)
    assert main(["envs", "list", "corrgrpo/AgentDojo-v0"]) == 0
    out = capsys.readouterr().out
    assert AGENTDOJO_HINT in out
    assert "unavailable" in out and "[yellow]" not in out  # our own markup still renders


def test_envs_list_shows_reward_names_and_ids_with_brackets(monkeypatch, capsys):
    def bracketed(env_id):
        return {"id": env_id, "description": "", "tasks": {"all": 2},
                "rewards": [{"name": "[b]score", "low": 0.0, "high": 1.0, "weight": 1.0}]}

    monkeypatch.setattr(envs_commands, "describe_env", bracketed)
    assert main(["envs", "list", "corrgrpo/ScaleDominance-v0"]) == 0
    out = capsys.readouterr().out
    assert "[b]score" in out and "[0, 1]" in out


def test_a_config_error_quoting_brackets_prints_them(capsys):
    assert main(["train", "env_configs/quickstart.yaml", "model.dtype='[b]half'"]) == 2
    err = capsys.readouterr().err
    assert "'[b]half' is not allowed" in err and err.count("\n") == 1


def test_the_run_banner_and_progress_bar_print_user_text_as_it_is():
    from corrgrpo.trainer.commands.train import _banner
    from corrgrpo.trainer.config import Config
    from corrgrpo.trainer.progress import TrainProgress

    cfg = Config()
    cfg.model.name_or_path = "models/[b]mine"
    trainer = SimpleNamespace(world=1, torch_threads=2, torch_threads_source="OMP_NUM_THREADS",
                              output_dir="runs/[red]x")
    console = Console(record=True, width=300)
    console.print(_banner(cfg, trainer), soft_wrap=True)
    text = console.export_text()
    assert "model models/[b]mine" in text and "-> runs/[red]x" in text
    assert text.startswith("corrgrpo corrgrpo/ScaleDominance-v0")  # [bold] rendered, not shown
    progress = TrainProgress(total=3, enabled=False)
    assert progress._progress.columns[-1].markup is False  # reward names are the env's


# ---------------------------------------------- (b) the override gets the blame
def test_a_typo_in_an_overrides_section_names_the_override():
    with pytest.raises(ConfigError) as info:
        load_config("env_configs/quickstart.yaml", ["algoritm.x=1"])
    message = str(info.value)
    assert message.startswith("override 'algoritm.x=1': unknown key 'algoritm'; allowed keys: algorithm,")
    assert "quickstart.yaml" not in message
    with pytest.raises(ConfigError, match=r"^override 'algoritm.x.y=1': unknown key 'algoritm'"):
        load_config("env_configs/quickstart.yaml", ["algoritm.x.y=1"])


def test_a_typo_in_the_files_section_still_names_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text("env: {id: corrgrpo/ScaleDominance-v0}\nalgoritm:\n  x: 1\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2: unknown key 'algoritm'"):
        load_config(path, ["algorithm.group_size=4"])
    # the command line: one error line naming the override
    assert main(["train", "env_configs/quickstart.yaml", "algoritm.x=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: override 'algoritm.x=1': unknown key 'algoritm'")


# --------------------------------------------------------- (c) advise's advice
def _metrics_run(tmp_path: Path, name: str, records: list[dict]) -> Path:
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def _record(step: int, names=("a", "b", "c"), **changes) -> dict:
    record = {
        "step": step, "reward_names": list(names), "k_eff/mean": 2.5, "zero_variance_fraction": 0.0,
        "c_q/median": 1.0, "update_norm": 0.01, **{f"active_fraction/{n}": 1.0 for n in names},
        **{f"cov_share/{n}": 1 / len(names) for n in names},
    }
    record.update(changes)
    return record


def test_the_gradient_advice_follows_the_direction_of_the_number(tmp_path, capsys):
    rising = [0.1] * 3 + [0.15] * 6 + [0.25] * 3
    falling = [1.3] * 3 + [0.6] * 6 + [0.17] * 3  # 0.13x
    up = _metrics_run(tmp_path, "up", [_record(i + 1, grad_norm=g) for i, g in enumerate(rising)])
    down = _metrics_run(tmp_path, "down", [_record(i + 1, grad_norm=g) for i, g in enumerate(falling)])
    (grew,) = advise([up])
    (fell,) = advise([down])
    assert grew.condition == fell.condition == "grad_drift"
    assert grew.numbers["grad_norm"]["direction"] == "rising" and "rose from 0.1 to 0.25 (2.50x" in grew.summary
    assert fell.numbers["grad_norm"]["direction"] == "falling" and "fell from 1.3 to 0.17 (0.13x" in fell.summary
    assert "a gradient that grows makes the later steps larger" in grew.advice
    assert "grows" not in fell.advice and "a gradient that falls makes the later steps smaller" in fell.advice
    assert fell.advice == ADVICE["grad_drift_falling"].text
    assert main(["advise", str(down), "--json"]) == 0
    (found,) = json.loads(capsys.readouterr().out)
    assert found["advice"] == fell.advice and found["condition"] == "grad_drift"


def test_components_that_never_vary_share_one_finding_and_one_block(tmp_path, capsys):
    quiet = {"active_fraction/b": 0.0, "active_fraction/c": 0.005}
    run = _metrics_run(tmp_path, "quiet", [_record(i + 1, **quiet) for i in range(4)])
    (finding,) = advise([run])
    assert finding.condition == "never_varies" and finding.numbers["components"] == ["b", "c"]
    assert finding.summary == "b never; c in 0.5% of the groups: vary within a group (over 4 steps)"
    assert main(["advise", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.count("[never_varies]") == 1 and out.count("    try: ") == 1
    one = _metrics_run(tmp_path, "one", [_record(i + 1, **{"active_fraction/b": 0.0}) for i in range(4)])
    (single,) = advise([one])
    assert single.summary == "b never: varies within a group (over 4 steps)"


def test_findings_with_the_same_advice_print_it_once(tmp_path, capsys):
    near = [[1.0, 0.95, 0.95], [0.95, 1.0, 0.95], [0.95, 0.95, 1.0]]  # three near-duplicate pairs
    run = _metrics_run(tmp_path, "dups", [_record(i + 1, reward_correlation=near) for i in range(4)])
    assert [f.condition for f in advise([run])] == ["duplicates"] * 3
    assert main(["advise", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.count("[duplicates]") == 3 and out.count("    try: ") == 1 and out.count("evidence:") == 1


# ------------------------------------------------------ (d) all rewards are 0
def test_the_zero_reward_watch_warns_once_per_run_of_zero_steps():
    watch = ZeroRewardWatch(streak=3)
    zero, scored = np.zeros((8, 2)), np.array([[0.0, 1.0]] + [[0.0, 0.0]] * 7)
    assert [watch.observe(s, zero) for s in (1, 2)] == [None, None]
    line = watch.observe(3, zero, env="myorg/Zero-v0")
    assert line.startswith("warning: every reward is 0 at steps 1-3 (8 episodes x 2 components each step)")
    assert "myorg/Zero-v0" in line
    assert watch.observe(4, zero) is None  # said once
    assert watch.observe(5, scored) is None  # one scored episode ends the run
    assert [watch.observe(s, zero) for s in (6, 7)] == [None, None]
    assert watch.observe(8, zero).startswith("warning: every reward is 0 at steps 6-8")
    assert watch.observe(9, np.zeros((0, 2))) is None  # an empty batch says nothing
    nan = ZeroRewardWatch(streak=1)
    assert nan.observe(1, np.full((2, 2), np.nan)) is None
    with pytest.raises(ValueError, match="streak must be >= 1"):
        ZeroRewardWatch(streak=0)


ZERO_ENV_MODULE = '''
import corrgrpo_envs
from corrgrpo_envs import MultiRewardEnv, StepOutcome, Task, TaskSource


class ZeroEnv(MultiRewardEnv):
    """Scores nothing: every reward of every answer is 0 (a server that lost its grader)."""

    def __init__(self, split: str = "all", **kwargs):
        tasks = TaskSource([Task(f"z{i}", {"i": i}) for i in range(4)])
        super().__init__(tasks.split(split), reward_names=("ok", "format"), reward_low=(0.0, 0.0),
                         reward_high=(1.0, 1.0), **kwargs)

    def _observe_task(self, task):
        return {"messages": [{"role": "user", "content": f"Count to {task['i']}."}], "tools": []}

    def _act(self, action):
        return StepOutcome(rewards={"ok": 0.0, "format": 0.0}, terminated=True)


corrgrpo_envs.register("{env_id}", ZeroEnv, description="scores nothing")
'''


@pytest.fixture
def zero_env_module(tmp_path, monkeypatch):
    """A module ``first_hour_zero_envs`` on sys.path whose import registers ``testorg/Zero-v0``."""
    env_id, module = "testorg/Zero-v0", "first_hour_zero_envs"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(ZERO_ENV_MODULE).replace("{env_id}", env_id))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # spawned reward workers
    yield env_id, module
    sys.modules.pop(module, None)
    if env_id in ENVS:
        ENVS.unregister(env_id)
    gym.registry.pop(env_id, None)


TINY = ["model.name_or_path=tiny", "algorithm.group_size=2", "algorithm.prompts_per_step=2",
        "rollout.max_new_tokens=4", "rollout.torch_threads=1", "train.progress=false",
        "train.tensorboard=false", "train.save_final=false", "train.split=all"]


@pytest.mark.timeout(300)
def test_a_run_whose_rewards_are_all_zero_says_so_while_training(tmp_path, zero_env_module, capsys):
    env_id, module = zero_env_module
    config = tmp_path / "zero.yaml"
    config.write_text(f"env:\n  id: {env_id}\n  import: [{module}]\n")
    assert main(["train", str(config), *TINY, "train.steps=4", f"train.output_dir={tmp_path / 'run'}"]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning: every reward is 0")]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"warning: every reward is 0 at steps 1-3 (4 episodes x 2 components each step): {env_id}")


# ------------------------------------------------------------- (e) env.import
def test_a_registered_id_from_an_imported_module_resolves(tmp_path, zero_env_module):
    env_id, module = zero_env_module
    assert env_id not in corrgrpo_envs.registered_ids()
    cfg = load_config(None, [f"env.id={env_id}", f"env.import=[{module}]"])
    assert env_id in corrgrpo_envs.registered_ids() and cfg.env.imports == (module,)
    from corrgrpo.trainer.setup import build_vector_env, env_kwargs

    assert "import" not in env_kwargs(cfg)  # the trainer's key, not the env's keyword argument
    for executor in ("thread", "process"):  # a spawned worker imports the module itself
        cfg.rollout.reward_executor = executor
        venv = build_vector_env(cfg, num_groups=1, group_size=2, split="all")
        try:
            assert venv.reward_names == ("ok", "format") and len(venv.task_ids) == 4
        finally:
            venv.close()


def test_without_the_import_the_id_is_unknown_and_a_bad_import_is_named(tmp_path, capsys):
    assert main(["train", "env_configs/quickstart.yaml", "env.id=testorg/Nowhere-v0"]) == 2
    assert "unknown env id 'testorg/Nowhere-v0'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"^override 'env.import=\[no_such_pkg.envs\]': env.import: "
                                          r"cannot import 'no_such_pkg.envs' \(No module named 'no_such_pkg'\)"):
        load_config("env_configs/quickstart.yaml", ["env.import=[no_such_pkg.envs]"])
    with pytest.raises(ConfigError, match=r"env.import: expected a list of module names such as \[mypkg.envs\], "
                                          r"got \['not a module'\]"):
        load_config("env_configs/quickstart.yaml", ["env.import=[not a module]"])
    broken = tmp_path / "first_hour_broken_envs.py"
    broken.write_text("raise RuntimeError('no grader configured')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ConfigError, match=r"env.import: importing 'first_hour_broken_envs' raised "
                                              r"RuntimeError: no grader configured"):
            load_config("env_configs/quickstart.yaml", ["env.import=first_hour_broken_envs"])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("first_hour_broken_envs", None)


def test_at_80_columns_the_progress_bar_cuts_no_number():
    import io

    from corrgrpo.trainer.progress import TrainProgress

    record = {"reward/weighted/mean": 0.5, "reward/digits/mean": 31.25, "reward/has_a/mean": 0.75,
              "reward/word_with_a/mean": 0.5, "reward/a_longer_component_name/mean": 1.0,
              "c_q/median": 1.07, "time/step": 2.5}
    progress = TrainProgress(total=30)
    progress.update(3, record)
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False).print(progress._progress.get_renderable())
    shown = " ".join(out.getvalue().split())
    assert "…" not in out.getvalue()
    for number in ("R=0.500", "c_q=1.07", "2.50s/step", "digits=31.25", "word_with_a=0.50",
                   "a_longer_component_name=1.00"):
        assert number in shown, (number, out.getvalue())
    assert all(len(line) <= 80 for line in out.getvalue().splitlines())
