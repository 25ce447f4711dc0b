"""A module that does not import: the user's own module off ``sys.path`` is named with where
Python looked; a module it imports that is missing is a dependency to install.

``corrgrpo envs check mypkg.envs:MyEnv`` once said "missing dependency mypkg (pip install
mypkg)" for a local ``mypkg`` that was not on ``sys.path``, pointing at whatever PyPI package
has that name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from corrgrpo.trainer.cli import main
from corrgrpo_registry import import_error_hint


@pytest.fixture
def user_folder(tmp_path, monkeypatch) -> Path:
    """An empty working folder; the modules the tests import are forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # main() puts the working folder first
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("hint_"):
            del sys.modules[name]


def test_a_local_module_off_sys_path_names_the_folders_searched(user_folder, capsys):
    assert main(["envs", "check", "hint_mypkg.envs:MyEnv"]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error: hint_mypkg.envs:MyEnv: cannot import hint_mypkg: no hint_mypkg.py or "
                          f"hint_mypkg/ in any folder on sys.path ({user_folder} (the working directory), ")
    assert out.endswith("): run from the folder that holds it, or add that folder to PYTHONPATH")
    assert "pip install" not in out and out.count("\n") == 0
    site = next(p for p in sys.path if p.endswith("site-packages"))
    assert site in out  # every folder searched, in order


def test_a_package_without_the_submodule_names_the_package_folder(user_folder, capsys):
    (user_folder / "hint_pkg").mkdir()
    (user_folder / "hint_pkg" / "__init__.py").write_text("")
    assert main(["envs", "check", "hint_pkg.envs:MyEnv"]) == 2
    assert capsys.readouterr().out == (f"error: hint_pkg.envs:MyEnv: cannot import hint_pkg.envs: package "
                                       f"hint_pkg ({user_folder / 'hint_pkg'}) has no envs.py or envs/\n")


def test_a_missing_third_party_import_is_a_dependency_to_install(user_folder, capsys):
    (user_folder / "hint_deps.py").write_text("import hint_absent_dependency\n")
    assert main(["envs", "check", "hint_deps:MyEnv"]) == 2
    assert capsys.readouterr().out == ("error: hint_deps:MyEnv: missing dependency hint_absent_dependency "
                                       "(pip install hint_absent_dependency)\n")
    with pytest.raises(ImportError) as info:
        import hint_deps  # noqa: F401
    assert import_error_hint("hint_deps", info.value) == (
        "hint_deps imports hint_absent_dependency, which is not installed here: pip install hint_absent_dependency")


def test_the_hint_says_when_the_working_directory_is_not_searched(user_folder, monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(user_folder))])
    with pytest.raises(ImportError) as info:
        import hint_elsewhere  # noqa: F401
    hint = import_error_hint("hint_elsewhere.envs", info.value)
    assert f"; the working directory {user_folder} is not on it): run from the folder" in hint
    assert f"{user_folder} (the working directory)" not in hint


def test_an_env_id_entry_point_in_a_config_gets_the_same_hint(user_folder, capsys):
    assert main(["train", "quickstart.yaml", "env.id=hint_nowhere.envs:Env"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert ("env.id: entry point 'hint_nowhere.envs:Env': cannot import 'hint_nowhere' (No module named "
            "'hint_nowhere'); no hint_nowhere.py or hint_nowhere/ in any folder on sys.path (") in err
    assert "pip install" not in err
