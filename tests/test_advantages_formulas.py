"""GRPO-family estimators use their formulas as written (no CorrGRPO tolerance), CorrGRPO's
tolerance is judged on centred values (an offset cannot hide variation), RLOO and
REINFORCE++ against hand computations, entry points, and the module's imports."""

from __future__ import annotations

import ast
import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.trainer.estimators import available_estimators, compute_advantages, get_estimator

ROOT = Path(__file__).resolve().parents[1]
SHIFT_INVARIANT = ["grpo", "dr_grpo", "corrgrpo", "mo_grpo", "gdpo", "gdpo_corr", "rloo", "reinforce_pp"]


def _adv(rewards, groups, estimator, **options) -> np.ndarray:
    return compute_advantages(
        torch.as_tensor(np.asarray(rewards, dtype=np.float64)), torch.as_tensor(groups),
        estimator=estimator, **options,
    ).advantages.double().numpy()


# ----------------------------------------------------------------- offsets of 1e7
def test_grpo_on_rewards_near_1e7_follows_its_formula():
    # two components; the first varies by 1 around 1e7, the second by 1 around 0
    base = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    groups = [0, 0, 0, 0]
    t = base.sum(1)
    want = (t - t.mean()) / (t.std(ddof=1) + 1e-6)  # 1 -> 0, +-1.2247 at the ends
    for offset in (0.0, 1e7):
        got = _adv(base + [offset, 0.0], groups, "grpo")
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert want[-1] == pytest.approx(1.2247, abs=1e-4)


@pytest.mark.parametrize("estimator", SHIFT_INVARIANT)
def test_an_offset_of_1e7_changes_nothing(estimator):
    rng = np.random.default_rng(3)
    rewards = rng.integers(0, 3, size=(16, 3)).astype(np.float64)
    groups = np.repeat(np.arange(4), 4)
    plain = _adv(rewards, groups, estimator)
    shifted = _adv(rewards + np.array([1e7, -3e6, 0.0]), groups, estimator)
    np.testing.assert_allclose(shifted, plain, rtol=1e-6, atol=1e-6)


def test_corrgrpo_tolerance_is_judged_on_centred_values():
    # a component that varies by 1 on top of 1e7 is active; one constant at 1e7 is not
    rewards = np.array([[1e7, 1e7, 0.0], [1e7 + 1, 1e7, 1.0], [1e7, 1e7, 1.0], [1e7 + 1, 1e7, 0.0]])
    result = compute_advantages(torch.as_tensor(rewards), torch.zeros(4, dtype=torch.long))
    assert result.stats.k_eff.item() == pytest.approx(2.0)  # two independent active components
    # variation of 1e-9 on values ~1 is float noise for CorrGRPO: that component counts as
    # constant (not rescaled to unit variance) ...
    tiny = np.array([[1.0, 0.0], [1.0 + 1e-9, 1.0], [1.0, 1.0], [1.0 + 1e-9, 0.0]])
    np.testing.assert_allclose(_adv(tiny, [0] * 4, "corrgrpo"), _adv(tiny[:, 1:], [0] * 4, "corrgrpo"))
    only_tiny = tiny[:, :1]
    assert _adv(only_tiny, [0] * 4, "corrgrpo").tolist() == [0.0] * 4
    # ... while GRPO takes it at face value: its formula has no tolerance
    t = only_tiny[:, 0]
    want = (t - t.mean()) / (t.std(ddof=1) + 1e-6)
    assert abs(want[1]) > 1e-4
    np.testing.assert_allclose(_adv(only_tiny, [0] * 4, "grpo"), want, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(-3, 3), min_size=2, max_size=2), min_size=6, max_size=12),
    st.sampled_from(SHIFT_INVARIANT),
    st.floats(-1e7, 1e7, allow_nan=False),
    st.floats(0.1, 10.0),
)
def test_invariances(rows, estimator, offset, scale):
    """Any offset leaves every estimator unchanged; one scale factor on all rewards scales
    Dr. GRPO and RLOO by it and leaves the normalised ones unchanged."""
    rewards = np.asarray(rows, dtype=np.float64)
    groups = np.arange(len(rewards)) % 3
    plain = _adv(rewards, groups, estimator)
    np.testing.assert_allclose(_adv(rewards + offset, groups, estimator), plain, rtol=1e-5, atol=1e-5)
    scaled = _adv(rewards * scale, groups, estimator)
    if estimator in ("dr_grpo", "rloo"):
        np.testing.assert_allclose(scaled, plain * scale, rtol=1e-5, atol=1e-5)
    elif estimator in ("corrgrpo", "gdpo_corr"):
        pass  # eps inside sqrt(S + eps) is not scaled: close, not equal, by design
    else:
        # eps is added to a std that scales: equal up to eps / std
        np.testing.assert_allclose(scaled, plain, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------- RLOO, REINFORCE++
def test_rloo_hand_computed():
    rewards = [[1.0], [2.0], [6.0], [3.0], [5.0]]
    groups = [0, 0, 0, 1, 1]
    # group 0: 1 - (2+6)/2 = -3, 2 - 3.5 = -1.5, 6 - 1.5 = 4.5; group 1: 3 - 5 = -2, 5 - 3 = 2
    np.testing.assert_allclose(_adv(rewards, groups, "rloo"), [-3.0, -1.5, 4.5, -2.0, 2.0], rtol=1e-6)
    assert _adv([[4.0]], [0], "rloo").tolist() == [0.0]  # a group of one has no baseline


def test_rloo_uses_weighted_totals():
    rewards = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    got = compute_advantages(torch.tensor(rewards), torch.tensor([0, 0, 0]), estimator="rloo",
                             weights=torch.tensor([2.0, 1.0])).advantages
    # t = 2, 1, 3: 2 - 2 = 0, 1 - 2.5 = -1.5, 3 - 1.5 = 1.5
    torch.testing.assert_close(got, torch.tensor([0.0, -1.5, 1.5]))


def test_reinforce_pp_hand_computed():
    rewards = [[1.0], [3.0], [10.0], [14.0]]
    groups = [0, 0, 1, 1]
    # group baseline: -1, 1, -2, 2; batch mean 0, unbiased std sqrt(10/3)
    std = math.sqrt(10 / 3)
    np.testing.assert_allclose(_adv(rewards, groups, "reinforce_pp"),
                               np.array([-1, 1, -2, 2]) / (std + 1e-6), rtol=1e-6)
    # no baseline: whiten the returns 1, 3, 10, 14 (mean 7, std sqrt(146/3))
    std = math.sqrt(((1 - 7) ** 2 + (3 - 7) ** 2 + 9 + 49) / 3)
    np.testing.assert_allclose(_adv(rewards, groups, "reinforce_pp", baseline="none"),
                               (np.array([1, 3, 10, 14]) - 7) / (std + 1e-6), rtol=1e-6)
    with pytest.raises(ValueError, match="baseline"):
        _adv(rewards, groups, "reinforce_pp", baseline="batch")


def test_new_estimators_are_registered():
    assert {"rloo", "reinforce_pp"} <= set(available_estimators())


# ----------------------------------------------------------------- entry points
def test_estimator_entry_point(tmp_path, monkeypatch):
    (tmp_path / "my_estimators.py").write_text(textwrap.dedent("""
        def negated_dr_grpo(groups, *, factor: float = 1.0):
            return -factor * groups.weighted.sum(dim=1)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    got = _adv([[0.0], [2.0]], [0, 0], "my_estimators:negated_dr_grpo", factor=2.0)
    np.testing.assert_allclose(got, [2.0, -2.0])
    with pytest.raises(ValueError, match="no attribute 'missing'"):
        get_estimator("my_estimators:missing")
    with pytest.raises(ValueError, match="cannot import"):
        get_estimator("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="unknown option"):
        _adv([[0.0], [2.0]], [0, 0], "my_estimators:negated_dr_grpo", scale=2.0)
    sys.modules.pop("my_estimators", None)


def test_nonfinite_estimator_output_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "bad_estimators.py").write_text(
        "import torch\n\ndef nan_est(groups):\n    return torch.full_like(groups.numerator, float('nan'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="non-finite advantage"):
        _adv([[0.0], [2.0]], [0, 0], "bad_estimators:nan_est")
    sys.modules.pop("bad_estimators", None)


#: The project's packages whose imports are followed (importing one of their modules runs
#: its package's ``__init__`` too, so those count as well).
PROJECT = ("corrgrpo", "corrgrpo_envs", "corrgrpo_registry")


def _source(module: str) -> Path:
    path = ROOT / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _external_imports(module: str, seen: set[str] | None = None) -> set[str]:
    """Top-level packages ``module`` imports, following the project's own modules (whose
    imports count as the importer's: importing one imports everything it imports, and its
    packages' ``__init__`` modules)."""
    seen = set() if seen is None else seen
    seen.add(module)
    parts = module.split(".")
    out = set()
    for package in (".".join(parts[:i]) for i in range(1, len(parts))):
        if package not in seen:
            out |= _external_imports(package, seen)
    tree = ast.parse(_source(module).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    for name in names:
        if name.split(".")[0] in PROJECT:
            assert _source(name).exists(), name
            if name not in seen:
                out |= _external_imports(name, seen)
        else:
            out.add(name.split(".")[0])
    return out


@pytest.mark.parametrize("module", ["corrgrpo.trainer.estimators", "corrgrpo.trainer.losses"])
def test_estimator_and_loss_modules_import_only_torch_and_numpy(module):
    imported = _external_imports(module)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert "torch" in imported and imported - stdlib <= {"numpy", "torch"}, imported


def test_the_registry_imports_only_the_standard_library():
    imported = _external_imports("corrgrpo_registry")
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_the_import_walk_follows_package_inits():
    """Importing a module under corrgrpo_envs runs its ``__init__``, which imports Gymnasium:
    the walk must see it (why the registry is not a module under corrgrpo_envs)."""
    assert "gymnasium" in _external_imports("corrgrpo_envs.tasks")
