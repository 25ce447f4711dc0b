"""The snippets of docs/trainer.md's "Adding your own" run as written."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

from corrgrpo.trainer import estimators as advantages
from corrgrpo.trainer import losses
from corrgrpo.trainer.config import load_config

DOC = Path(__file__).resolve().parents[1] / "docs" / "trainer.md"


def _blocks(lang: str) -> list[str]:
    section = DOC.read_text(encoding="utf-8").split("### Adding your own", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.DOTALL)


@pytest.fixture
def registries():
    """Registrations made by a test are undone after it."""
    restores = [advantages.ESTIMATORS.snapshot(), losses.LOSSES.snapshot()]
    yield
    for restore in restores:
        restore()


def test_registered_estimator_and_loss_from_the_yaml(tmp_path, registries):
    (python,) = _blocks("python")
    exec(compile(python, str(DOC), "exec"), {})
    (yaml_block,) = _blocks("yaml")
    path = tmp_path / "custom.yaml"
    path.write_text(yaml_block)
    cfg = load_config(path)
    from corrgrpo.trainer.setup import build_loss

    fn, loss_cfg = build_loss(cfg)
    assert loss_cfg.agg_mode == "seq-mean-token-mean"
    logp = torch.tensor([[-1.0, -2.0], [-1.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = fn(losses.LossInputs(logp=logp, old_logp=logp.detach(), advantages=torch.tensor([1.0, -1.0]),
                               mask=mask, options=loss_cfg))
    # seq-mean-token-mean of -A * logp: ((1 + 2) / 2 + (-1) / 1) / 2
    assert out.loss.item() == pytest.approx(0.25)
    result = advantages.compute_advantages(torch.tensor([[0.0], [2.0]]), torch.tensor([0, 0]),
                                           estimator=cfg.algorithm.estimator,
                                           **cfg.algorithm.estimator_options)
    torch.testing.assert_close(result.advantages, torch.tensor([-0.25, 0.25]))


def test_entry_points_on_the_command_line(tmp_path, monkeypatch):
    (python,) = _blocks("python")
    plain = "\n".join(line for line in python.splitlines() if not line.startswith("@register"))
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "est.py").write_text(plain)
    (package / "losses.py").write_text(plain)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("mypkg", "mypkg.est", "mypkg.losses"):  # another test's mypkg may be cached
        monkeypatch.delitem(sys.modules, name, raising=False)
    (bash,) = _blocks("bash")
    words = shlex.split(bash.replace("\\\n", " "))
    assert words[:2] == ["corrgrpo", "train"]
    cfg = load_config(words[2], words[3:])
    assert cfg.algorithm.estimator == "mypkg.est:half_dr_grpo"
    assert losses.get_loss(cfg.algorithm.loss).__name__ == "reinforce"
    for name in ("mypkg", "mypkg.est", "mypkg.losses"):
        sys.modules.pop(name, None)
