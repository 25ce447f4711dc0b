"""``package.module:attribute`` references to user code (estimators, losses, envs).

Standard library only, so the estimator and loss modules can use it and still import
nothing but torch and numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["load_entry_point"]


def load_entry_point(spec: str, what: str) -> Any:
    """The callable that ``spec`` (``package.module:attr.sub``) names.

    Raises ValueError naming ``what`` (``"estimator"``, ``"loss"``, ...) and ``spec`` when the
    module does not import, the attribute is missing or the object is not callable.
    """
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} entry point {spec!r}: cannot import {module_name!r} ({exc})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what} entry point {spec!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{what} entry point {spec!r} is not callable")
    return obj
