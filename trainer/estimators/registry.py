"""The estimator registry and the one way an estimator is written: as its :class:`Decomposition`.

An estimator turns a batch's :class:`~corrgrpo.trainer.estimators.groups.RewardGroups` into one
advantage per response. Each built-in one is written once, as its decomposition: the part
``a_ik`` of each reward component in each advantage, and :func:`decomposed` makes the
estimator ``A_i = sum_k a_ik`` of it, so the advantages and their attribution
(:mod:`corrgrpo.trainer.estimators.attribution`) cannot drift apart. A decomposition may also carry a
per-response loss weight (e.g. GD²PO's keep weight) and the estimator's own diagnostics.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch

from corrgrpo_registry import Registry

if TYPE_CHECKING:
    from corrgrpo.trainer.estimators.groups import RewardGroups

__all__ = [
    "DEFAULT_EPS",
    "ESTIMATORS",
    "Decomposition",
    "DecompositionFn",
    "Estimator",
    "available_estimators",
    "check_choice",
    "check_eps",
    "decomposed",
    "get_estimator",
    "EstimatorOptions",
    "option_names",
    "options_class",
    "register_estimator",
]

DEFAULT_EPS = 1e-6

Estimator = Callable[..., torch.Tensor]

#: The estimators by name (``algorithm.estimator``); an entry point ``package.module:function``
#: of any importable module works without registering.
ESTIMATORS: Registry[Estimator] = Registry("estimator")


class Decomposition(NamedTuple):
    """An estimator's advantages split by reward component: ``A_i = sum_k parts[i, k]``.

    Attributes:
        parts: ``[N, K]`` float64, ``a_ik``: component k's part of response i's advantage.
        group_weight: the effective weight of each group, the factor its centred weighted
            rewards are multiplied by: ``[G]``, or ``[G, K]`` for an estimator that weighs
            each component on its own (NaN where a component is constant); batch-level
            centring is not a factor and is left out. None when the estimator does not say.
        loss_weight: ``[N]`` a factor (finite, >= 0) on each response's policy-gradient term
            (DARA's port of GD²PO puts the per-prompt keep weight there), applied by every loss
            (``LossInputs.sequence_weights``); None means 1 for every response.
        metrics: the estimator's own diagnostics of the batch (plain floats by name, e.g.
            ``conflict_ratio``), logged under ``estimator/<name>``; a name ending in ``/<k>``
            is about component k and is logged with the component's name instead of k.
    """

    parts: torch.Tensor
    group_weight: torch.Tensor | None = None
    loss_weight: torch.Tensor | None = None
    metrics: Mapping[str, float] | None = None


#: ``decompose(groups, *, **options) -> Decomposition`` (a plain ``(parts, group_weight)`` tuple works).
DecompositionFn = Callable[..., Decomposition]


def as_decomposition(value: Any) -> Decomposition:
    """A :class:`Decomposition` from what a decompose function returned (a tuple of 1-4 fields)."""
    return value if isinstance(value, Decomposition) else Decomposition(*value)


def decomposed(decompose: DecompositionFn) -> Estimator:
    """The estimator ``A_i = sum_k a_ik`` of a decomposition ``decompose(groups, **options)``.

    Written once, an estimator yields both its advantages and its attribution: the returned
    function has ``decompose``'s options (keyword-only parameters) and docstring, and keeps
    ``decompose`` as its ``attribution`` attribute, where :mod:`corrgrpo.trainer.estimators.attribution`
    finds it. Put it under :func:`register_estimator`::

        @register_estimator("half_dr_grpo")
        @decomposed
        def half_dr_grpo(groups, *, factor: float = 0.5) -> Decomposition:
            return Decomposition(factor * groups.weighted, torch.full_like(groups.counts, factor))
    """

    @functools.wraps(decompose)
    def advantages(groups: RewardGroups, **options: Any) -> torch.Tensor:
        return as_decomposition(decompose(groups, **options)).parts.sum(dim=1)

    advantages.attribution = decompose  # type: ignore[attr-defined]
    return advantages


def is_decomposed(fn: Estimator) -> bool:
    """Whether ``fn`` was made by :func:`decomposed` (and so has exact parts)."""
    return getattr(fn, "__wrapped__", None) is getattr(fn, "attribution", False)


def register_estimator(name: str, *, override: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator registering ``fn(groups: RewardGroups, *, **options) -> Tensor [N]``.

    Options of an estimator are its keyword-only parameters; ``compute_advantages``
    rejects any other option. Raises ValueError when ``name`` is taken unless
    ``override`` is true. A plain function gets the proportional attribution
    (:mod:`corrgrpo.trainer.estimators.attribution`); one made by :func:`decomposed` its exact parts.
    """
    return ESTIMATORS.register(name, override=override)


def available_estimators() -> list[str]:
    """Names of the registered estimators, sorted."""
    return ESTIMATORS.names()


def get_estimator(name: str) -> Estimator:
    """The estimator registered under ``name``, or the function of an entry point ``pkg.mod:fn``.

    ValueError listing the known ones for an unknown name, or saying why an entry point
    cannot be loaded.
    """
    return ESTIMATORS.get(name)


def option_names(fn: Estimator) -> tuple[str, ...]:
    """``fn``'s keyword-only parameters, cached: reading a signature costs more than some estimators."""
    try:
        return _keyword_only(fn)
    except TypeError:  # an unhashable callable object: read it every time
        return _keyword_only.__wrapped__(fn)


@functools.lru_cache(maxsize=256)
def _keyword_only(fn: Estimator) -> tuple[str, ...]:
    params = inspect.signature(fn).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


def check_eps(eps: float, name: str = "eps") -> float:
    """``eps`` as a float, or ValueError unless it is a finite number >= 0."""
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {eps!r}")
    return float(eps)


def check_choice(value: str, choices: tuple[str, ...], name: str) -> str:
    """``value`` if it is one of ``choices``, else ValueError naming the option and the choices."""
    if value not in choices:
        raise ValueError(f"option {name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


class EstimatorOptions(Mapping[str, Any]):
    """The base of an estimator's options class (:func:`options_class`): a dataclass of its
    keyword-only parameters that reads as a mapping, so ``estimator(groups, **options)`` works."""

    def __getitem__(self, name: str) -> Any:
        if name not in self.__dataclass_fields__:  # type: ignore[attr-defined]
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.__dataclass_fields__)  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.__dataclass_fields__)  # type: ignore[attr-defined]


#: Option types a config can give (YAML values); an option of another type is taken as it is.
_YAML_TYPES = (type(None), bool, int, float, str, list, dict)


def _config_type(tp: Any) -> Any:
    """``tp`` when a YAML value can be checked against it, else ``Any``."""
    origin = typing.get_origin(tp)
    if origin is Literal or tp in _YAML_TYPES or origin in (list, dict):
        return tp
    if origin in (typing.Union, types.UnionType):
        args = [_config_type(a) for a in typing.get_args(tp)]
        return Any if Any in args else tp
    return Any


@functools.lru_cache(maxsize=256)
def options_class(fn: Estimator) -> type[EstimatorOptions]:
    """The options of estimator ``fn`` as a dataclass: one field per keyword-only parameter, with
    its annotation (``Any`` where a YAML value cannot be checked against it) and default; the
    declaration ``algorithm.estimator_options`` is built and checked against."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not evaluate: take the values as they are
        hints = {}
    fields = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        tp = _config_type(hints.get(p.name, Any))
        if p.default is inspect.Parameter.empty:
            fields.append((p.name, tp))
        elif isinstance(p.default, (list, dict, set)):  # a fresh copy per object, as dataclasses want
            fields.append((p.name, tp, dataclasses.field(default_factory=functools.partial(type(p.default),
                                                                                            p.default))))
        else:
            fields.append((p.name, tp, dataclasses.field(default=p.default)))
    name = "".join(part.title() for part in getattr(fn, "__name__", "estimator").split("_")) + "Options"
    return dataclasses.make_dataclass(name, fields, bases=(EstimatorOptions,), eq=True)
