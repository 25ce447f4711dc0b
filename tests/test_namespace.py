"""One import namespace: the trainer, the agents and the example configs are imported as
``corrgrpo.trainer``, ``corrgrpo.agents`` and ``corrgrpo.env_configs``, never under their generic
folder names, so a user's own ``trainer.py`` or ``agents.py`` beside their script breaks nothing.
(The installed wheel's contents are checked in ``test_example_configs.py``.)"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERIC = ("trainer", "agents", "env_configs")
#: where Python imports the project's modules: the library, its tests, benchmarks, studies,
#: scripts and the docs' examples
SOURCES = ("corrgrpo_envs", "corrgrpo_registry", "corrgrpo_sandbox", "trainer", "agents", "tests",
           "bench", "studies", "scripts", "examples", "mkdocs_hooks")


def _python_files() -> list[Path]:
    return [p for folder in SOURCES if (ROOT / folder).is_dir() for p in (ROOT / folder).rglob("*.py")]


def test_no_module_imports_a_generic_top_level_name():
    offenders = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}"
                          for n in names if n.split(".")[0] in GENERIC]
    assert offenders == []


def test_no_module_path_string_names_a_generic_top_level_package():
    # lazy imports, monkeypatch targets, entry points and "module:attr" specs name modules in
    # strings ("trainer.save_state()" in a TRL hint is TRL's trainer object, not a module)
    modules = "|".join(sorted({p.stem for folder in ("trainer", "agents") for p in (ROOT / folder).iterdir()
                               if p.stem != "__init__" and (p.suffix == ".py" or (p / "__init__.py").exists())}))
    pattern = re.compile(rf"""["'](?:trainer|agents)\.(?:{modules})\b|["']env_configs\.(?!py\b)[a-z_]""")
    offenders = [f"{path.relative_to(ROOT)}:{i}" for path in [*_python_files(), ROOT / "pyproject.toml"]
                 for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if pattern.search(line)]
    assert offenders == []


def test_the_docs_examples_import_through_corrgrpo():
    pattern = re.compile(r"^\s*(?:from (?:trainer|agents|env_configs)[. ]|import (?:trainer|agents|env_configs)\b)",
                         re.M)
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    assert [str(p.relative_to(ROOT)) for p in pages if pattern.search(p.read_text(encoding="utf-8"))] == []


def test_a_users_own_trainer_and_agents_modules_shadow_nothing(tmp_path):
    for name in GENERIC:
        (tmp_path / f"{name}.py").write_text(f"WHOSE = 'the user\\'s own {name}.py'\n")
    script = tmp_path / "train_my_agent.py"
    script.write_text(
        "import numpy as np\n"
        "import trainer, agents, env_configs\n"
        "from corrgrpo.trainer.estimators import compute_advantages\n"
        "from corrgrpo.trainer.config import load_config\n"
        "from corrgrpo.agents import ReferencePolicy\n"
        "import corrgrpo.env_configs as shipped\n"
        "import gymnasium as gym\n"
        "import corrgrpo_envs  # noqa: F401  (registers the envs)\n"
        "print(trainer.WHOSE, agents.WHOSE, env_configs.WHOSE, sep='|')\n"
        "result = compute_advantages(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]),\n"
        "                            np.array([0, 0, 1, 1]), estimator='corrgrpo')\n"
        "print(result.advantages.tolist())\n"
        "print(load_config('quickstart.yaml').env.id)\n"
        "print(ReferencePolicy.__module__, list(shipped.__path__)[0].endswith('env_configs'))\n"
        "env = gym.make('corrgrpo/ScaleDominance-v0')\n"
        "print(type(env.unwrapped).__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "the user's own trainer.py|the user's own agents.py|the user's own env_configs.py"
    assert len(eval(lines[1])) == 4  # noqa: S307 (our own printed list)
    assert lines[2] == "corrgrpo/ScaleDominance-v0"
    assert lines[3] == "corrgrpo.agents.scripted True"
    assert lines[4] == "ScaleDominanceEnv"
