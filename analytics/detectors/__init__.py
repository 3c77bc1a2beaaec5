"""Detectors, registered by name: every module of this package that defines one registers it on import.

    from analytics.detectors import build
    detectors = build()                      # one of each, default parameters
    detectors = build(["slow_node"])         # by name; an unknown name is a DetectorError naming it

The conformance test (tests/analytics/detectors/test_conformance.py) checks every registered detector.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence

from analytics.detectors.base import Detector
from analytics.errors import DetectorError

_REGISTRY: dict[str, type[Detector]] = {}


def register(cls: type[Detector]) -> type[Detector]:
    """Class decorator: make `cls` buildable by its `name`."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise DetectorError(f"two detectors are named {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def registered() -> dict[str, type[Detector]]:
    """Every detector class by name, after importing every module of this package."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return dict(sorted(_REGISTRY.items()))


def build(names: Sequence[str] | None = None) -> list[Detector]:
    """One detector of each class named (all when None), with default parameters."""
    classes = registered()
    unknown = sorted(set(names or ()) - set(classes))
    if unknown:
        raise DetectorError(f"unknown detector(s) {', '.join(unknown)}; known: {', '.join(classes)}")
    return [cls() for name, cls in classes.items() if names is None or name in names]
