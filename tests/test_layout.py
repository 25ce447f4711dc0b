"""The repository's layout: benchmarks and studies are packages run as modules, never installed,
and no file of theirs can shadow an installed package."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN_AS_MODULES = ("bench", "studies")


def _touches_sys_path(path: Path) -> bool:
    """Whether the file assigns to or calls a method of ``sys.path``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t.value if isinstance(t, ast.Subscript) else t for t in targets), None)
        if isinstance(target, ast.Attribute) and target.attr == "path" and getattr(target.value, "id", "") == "sys":
            return True
    return False


@pytest.mark.parametrize("folder", RUN_AS_MODULES)
def test_benchmarks_and_studies_are_packages_that_leave_sys_path_alone(folder):
    assert (ROOT / folder / "__init__.py").is_file()
    edits = [p.name for p in sorted((ROOT / folder).glob("*.py")) if _touches_sys_path(p)]
    assert not edits, f"{folder}/ edits sys.path in {edits}: run it as a module (python -m {folder}.NAME)"


def test_the_check_sees_a_sys_path_edit(tmp_path):
    for source in ("import sys\nsys.path.insert(0, 'x')\n", "import sys\nsys.path[:] = []\n"):
        (tmp_path / "m.py").write_text(source)
        assert _touches_sys_path(tmp_path / "m.py")
    (tmp_path / "m.py").write_text("import sys\nprint(sys.path)\n")
    assert not _touches_sys_path(tmp_path / "m.py")


@pytest.mark.parametrize("folder", RUN_AS_MODULES)
def test_no_file_name_is_an_installed_package(folder):
    """Run as a script, a folder leads sys.path: a file named like a package would replace it."""
    here = str(ROOT)
    shadows = []
    for path in sorted((ROOT / folder).glob("*.py")):
        spec = importlib.util.find_spec(path.stem) if path.stem != "__init__" else None
        if spec is not None and spec.origin and not spec.origin.startswith(here):
            shadows.append(f"{path.name} ({spec.origin})")
    assert not shadows, shadows


def test_benchmarks_and_studies_are_not_shipped():
    from fnmatch import fnmatch

    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]

    for folder in RUN_AS_MODULES:
        assert not any(fnmatch(folder, pattern) for pattern in include), (folder, include)
    assert all(any(fnmatch(p, pattern) for pattern in include)
               for p in ("corrgrpo_registry", "corrgrpo_sandbox", "corrgrpo_envs", "corrgrpo",
                         "corrgrpo.agents", "corrgrpo.trainer"))
