"""One error tree per package: every exception class a package defines derives from its root (and from
no other package's root), every class it raises is of its tree, of a package it may raise for, or an
allowed builtin, and its errors module's docstring draws the tree as the code defines it.

Read from the source (ast), so that no optional dependency has to be installed to check it.
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = {
    "collectors": "CollectorError",
    "hub": "HubError",
    "sim": "SimError",
    "analytics": "AnalyticsError",
    "alerts": "AlertsError",
    "ui": "UiError",
    "fleetlens": "FleetlensError",
}
# Builtins a package may raise: programmer errors and Python's protocols, never a failure of the input,
# the data, the configuration or the outside world (those are the package's own).
ALLOWED_BUILTINS = {
    "TypeError",  # an argument of the wrong type
    "ValueError",  # an argument value the calling code should not pass, or one a parse step raises to its
    # own function's `except` (data and configuration errors reaching a caller are the package's own)
    "RuntimeError",  # an API used out of order (a step phase outside a step)
    "NotImplementedError",
    "AssertionError",
    "AttributeError",  # __getattr__
    "KeyError",  # __getitem__
    "StopIteration",  # __next__
    "SystemExit",  # a module's `python -m` entry point
}
# OSError(errno, os.strerror(errno)): a socket's own error, raised as the call itself would have (hub).
OS_ERROR_FROM_ERRNO = "OSError"
# Another package's classes a package may raise, by package, each with why. sim plays the collectors'
# backends through what they read (sysfs files, collectors.gpu.sim's NVML answers), so a failure it
# simulates reaches the collectors as a real one would, and they raise their own errors. The one
# exception: sim.checks implements alerts.lifecycle's CheckTrigger, whose contract is to raise
# alerts' BackendError when a test cannot be asked for, which the lifecycle catches and records.
RAISES_FOR: dict[str, set[str]] = {"sim": {"alerts.errors.BackendError"}}
BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}
TREE_LINE = re.compile(r"^    (?P<branch>(?:[│ ]   )*(?:[├└]── )?)(?P<name>_?[A-Z]\w*)")


@dataclass
class Module:
    name: str
    tree: ast.Module
    # a class defined or a name imported at module level -> the qualified name it stands for
    names: dict[str, str] = field(default_factory=dict)


def _modules() -> dict[str, Module]:
    modules = {}
    for package in ROOTS:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = Module(name, ast.parse(path.read_text(), str(path)))
    for module in modules.values():
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef):
                module.names[node.name] = f"{module.name}.{node.name}"
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    module.names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return modules


MODULES = _modules()


def _resolve(module: Module, expr: ast.expr) -> str | None:
    """The qualified name of a class named by `expr` in `module`, if it names one we can tell."""
    if isinstance(expr, ast.Name):
        if expr.id in module.names:
            qualified = module.names[expr.id]
            owner, _, name = qualified.rpartition(".")
            if owner in MODULES and MODULES[owner].names.get(name, qualified) != qualified:
                return _resolve(MODULES[owner], ast.Name(name))  # re-exported: follow it to its definition
            return qualified
        if expr.id in BUILTIN_EXCEPTIONS:
            return f"builtins.{expr.id}"
    return None


def _classes() -> dict[str, list[str]]:
    """Every class defined at a module's top level -> its bases, qualified."""
    return {
        f"{module.name}.{node.name}": [
            base for base in map(lambda b: _resolve(module, b), node.bases) if base
        ]
        for module in MODULES.values()
        for node in module.tree.body
        if isinstance(node, ast.ClassDef)
    }


CLASSES = _classes()


def _ancestors(name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for base in CLASSES.get(todo.pop(), []):
            if base not in seen:
                seen.add(base)
                todo.append(base)
    return seen


def _root(package: str) -> str:
    return f"{package}.errors.{ROOTS[package]}"


def _exceptions(package: str) -> list[str]:
    """The exception classes `package` defines (an ancestor of theirs is a builtin exception)."""
    return sorted(
        name
        for name in CLASSES
        if name.split(".")[0] == package and any(a.startswith("builtins.") for a in _ancestors(name))
    )


def _tree(package: str) -> set[str]:
    root = _root(package)
    return {root} | {name for name in CLASSES if root in _ancestors(name)}


@pytest.mark.parametrize("package", ROOTS)
def test_every_exception_derives_from_the_package_root_and_no_other(package: str) -> None:
    others = {_root(other) for other in ROOTS if other != package}
    wrong = {
        name: sorted(_ancestors(name) & others) or "not under " + ROOTS[package]
        for name in _exceptions(package)
        if name != _root(package) and (_root(package) not in _ancestors(name) or _ancestors(name) & others)
    }
    assert not wrong, wrong


def _raised(package: str) -> list[tuple[str, int, str]]:
    """(module, line, qualified class) of every `raise X(...)` or `raise X` whose X names a class."""
    found = []
    for module in MODULES.values():
        if module.name.split(".")[0] != package:
            continue
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                call = node.exc if isinstance(node.exc, ast.Call) else None
                named = _resolve(module, call.func if call else node.exc)
                if named == f"builtins.{OS_ERROR_FROM_ERRNO}" and call and _is_errno_error(call):
                    continue
                if named is not None and (named in CLASSES or named.rpartition(".")[0] not in MODULES):
                    found.append((module.name, node.lineno, named))
    return found


def _is_errno_error(call: ast.Call) -> bool:
    second = call.args[1] if len(call.args) == 2 else None
    return isinstance(second, ast.Call) and ast.unparse(second.func) == "os.strerror"


@pytest.mark.parametrize("package", ROOTS)
def test_every_raised_class_is_of_the_tree_or_allowed(package: str) -> None:
    allowed = _tree(package) | RAISES_FOR.get(package, set()) | {f"builtins.{b}" for b in ALLOWED_BUILTINS}
    wrong = [
        f"{module}:{line} raises {name}" for module, line, name in _raised(package) if name not in allowed
    ]
    assert not wrong, "\n".join(wrong)


def _drawn(package: str) -> dict[str, str | None]:
    """The errors module's drawing: each class name -> the name drawn as its parent."""
    docstring = ast.get_docstring(MODULES[f"{package}.errors"].tree) or ""
    drawn: dict[str, str | None] = {}
    parents: list[str] = []
    for line in docstring.splitlines():
        match = TREE_LINE.match(line)
        if match is None:
            continue
        depth = len(match["branch"]) // 4
        parents[depth:] = [match["name"]]
        drawn[match["name"]] = parents[depth - 1] if depth else None
    return drawn


@pytest.mark.parametrize("package", ROOTS)
def test_the_errors_module_draws_the_tree_as_defined(package: str) -> None:
    tree = _tree(package)
    defined = {
        name.rpartition(".")[2]: next((b.rpartition(".")[2] for b in CLASSES[name] if b in tree), None)
        for name in tree
    }
    assert _drawn(package) == defined
