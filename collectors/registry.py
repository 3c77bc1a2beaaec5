"""Collectors register here by name, like node_exporter's; the exporter builds the enabled ones.

A collector module calls `register("name")` on a factory `(options, errors) -> Collector`. Modules are
listed in BUILTIN_MODULES and imported on first use, so importing the registry stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from collectors.base import Collector, CollectorOptions, ReadErrors
from collectors.errors import CollectorConfigError

Factory = Callable[[CollectorOptions, ReadErrors], Collector]

BUILTIN_MODULES = (
    "collectors.gpu.collector",
    "collectors.xid",
    "collectors.infiniband",
    "collectors.netclass",
    "collectors.nccl.collector",
)


@dataclass(frozen=True)
class Registration:
    name: str
    factory: Factory
    default_enabled: bool


@dataclass
class BuiltCollector:
    name: str
    collector: Collector
    errors: ReadErrors


_REGISTRY: dict[str, Registration] = {}


def register(name: str, *, default_enabled: bool = True) -> Callable[[Factory], Factory]:
    """Decorator: make `factory` available to the exporter as collector `name`."""

    def decorate(factory: Factory) -> Factory:
        if name in _REGISTRY and _REGISTRY[name].factory is not factory:
            raise ValueError(f"collector {name!r} is registered twice")
        _REGISTRY[name] = Registration(name, factory, default_enabled)
        return factory

    return decorate


def registrations() -> dict[str, Registration]:
    """Every known collector by name, builtins imported."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    return dict(sorted(_REGISTRY.items()))


def resolve(enable: Iterable[str] = (), disable: Iterable[str] = ()) -> list[str]:
    """The collector names to run: defaults, plus `enable`, minus `disable`; unknown names are an error."""
    known = registrations()
    enable, disable = list(enable), list(disable)
    unknown = sorted(set(enable + disable) - set(known))
    if unknown:
        raise CollectorConfigError(f"unknown collector(s) {', '.join(unknown)}; known: {', '.join(known)}")
    chosen = {name for name, reg in known.items() if reg.default_enabled} | set(enable)
    return sorted(chosen - set(disable))


def build(names: Iterable[str], options: CollectorOptions) -> list[BuiltCollector]:
    """Instantiate the named collectors, each with its own bad-input counter."""
    known = registrations()
    built = []
    for name in names:
        errors = ReadErrors(name)
        built.append(BuiltCollector(name, known[name].factory(options, errors), errors))
    return built
