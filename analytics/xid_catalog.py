"""What each NVIDIA Xid code means and what to do about it: one table, looked up by code.

Codes, mnemonics, descriptions and NVIDIA's resolution buckets (immediate and investigatory action) are
taken from NVIDIA's Xid catalog for Ampere and newer GPUs (CATALOG_SOURCE); codes that catalog does not
list come from NVIDIA's older Xid documentation. The fleetlens columns (likely cause, severity, action)
are ours, derived from the buckets as the module's table says. An unknown code is never dropped:
`lookup` answers an entry that says it is unknown.

    lookup(48).action    -> Action.RESET_GPU
    lookup(13).cause     -> Cause.APPLICATION
    worst_action([48, 63, 94]) -> Action.RESET_GPU
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

CATALOG_SOURCE = "NVIDIA Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)"


class Cause(StrEnum):
    """Who most likely made the Xid happen."""

    APPLICATION = "application"
    DRIVER = "driver"
    HARDWARE = "hardware"
    THERMAL_POWER = "thermal_power"
    UNKNOWN = "unknown"


class Action(StrEnum):
    """What an operator should do, mildest first (the order `worst_action` ranks by)."""

    NONE = "none"
    RESTART_JOB = "restart_job"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    INSPECT = "drain_for_inspection"

    @property
    def drains(self) -> bool:
        """Whether the node must leave service for it: a reset, a reboot or an inspection."""
        return self in (Action.RESET_GPU, Action.REBOOT_NODE, Action.INSPECT)

    @property
    def rank(self) -> int:
        return list(Action).index(self)


@dataclass(frozen=True)
class XidInfo:
    """One catalog row: NVIDIA's columns, then fleetlens's judgement of it."""

    code: int
    mnemonic: str
    description: str
    immediate: str  # NVIDIA's resolution bucket, e.g. RESTART_APP, RESET_GPU, RESTART_BM, IGNORE
    investigatory: str  # e.g. CHECK_APP/CUDA, CONTACT_SUPPORT, WORKFLOW_XID_48
    cause: Cause
    severity: str  # info, warning or critical (analytics.detectors.base.SEVERITIES)
    action: Action
    documented: bool = True

    @property
    def by_application(self) -> bool:
        return self.cause is Cause.APPLICATION


_CATALOG: dict[int, XidInfo] = {}


def lookup(code: int) -> XidInfo:
    """The catalog's row for `code`; a code the catalog lacks gets a row saying it is unknown."""
    info = _CATALOG.get(code)
    if info is not None:
        return info
    return XidInfo(
        code,
        "UNKNOWN",
        f"Xid {code} is not in {CATALOG_SOURCE}",
        "UNKNOWN",
        "UNKNOWN",
        Cause.UNKNOWN,
        "warning",
        Action.NONE,
        documented=False,
    )


def worst_action(codes: Iterable[int]) -> Action:
    """The most disruptive action any of `codes` asks for (NONE for no codes)."""
    return max((lookup(code).action for code in codes), key=lambda action: action.rank, default=Action.NONE)


def catalog() -> tuple[XidInfo, ...]:
    """Every documented row, by code."""
    return tuple(_CATALOG[code] for code in sorted(_CATALOG))
