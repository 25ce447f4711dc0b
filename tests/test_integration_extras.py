"""The ``trl`` and ``verl`` extras pin the versions the integrations are tested with: the TRL
and verl venv scripts install those same versions, and the docs' install lines use the extras."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _installed_by(script: str) -> set[str]:
    """The ``name==version`` pins a venv script installs."""
    return set(re.findall(r"[A-Za-z0-9_.-]+==[0-9][A-Za-z0-9.]*", (ROOT / "scripts" / script).read_text()))


def test_the_trl_extra_pins_the_trl_the_venv_script_installs():
    assert _extras()["trl"] == ["trl==1.16.0"]
    assert "trl==1.16.0" in _installed_by("trl_venv.sh")


def test_the_verl_extra_pins_what_the_venv_script_installs_for_verls_trainer():
    verl = _extras()["verl"]
    assert verl[0] == "verl==0.9.1" and {"hydra-core==1.3.8", "omegaconf==2.3.0"} <= set(verl)
    assert set(verl) <= _installed_by("verl_venv.sh")


def test_the_docs_install_lines_use_the_extras():
    for page, extra in (("docs/trl.md", "trl"), ("docs/verl.md", "verl"), ("README.md", "trl"),
                        ("README.md", "verl"), ("docs/how-to/other-trainers.md", "trl"),
                        ("docs/how-to/other-trainers.md", "verl")):
        assert f'pip install "corrgrpo[{extra}]"' in (ROOT / page).read_text(), (page, extra)


def test_the_main_venv_setup_does_not_install_the_trainer_extras():
    test_script = (ROOT / "scripts" / "test.sh").read_text()
    assert "[trl" not in test_script and "[verl" not in test_script and ",trl" not in test_script
