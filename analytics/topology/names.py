"""What every topology importer accepts as input and as a name, in one place.

Every byte an importer reads came from another tool, so each name it reports passes one allowlist:
a string, 1 to MAX_NAME_CHARS characters, every one printable (no control, format or bidi-override
characters, so a name can be neither a second log line nor disguised), and no whitespace at either end.
The input as a whole is at most MAX_INPUT_CHARS.

What a hypervisor sees is named within its host: a PF's interface ("eth0") or a PCI address
("0000:06:12.5") repeats on every host, so such an entity is named "<host>/<local name>" (host_scoped),
the same whichever importer or host agent reports it. Anything else is refused with a TopologyError that names
the source, where in it, and what is wrong; nothing of a refused input is imported.
"""

from __future__ import annotations

from pathlib import PurePath

from analytics.errors import TopologyError
from analytics.topology.model import Entity, Kind, Link

MAX_NAME_CHARS = 253  # a DNS name's limit; longer than any switch, host, domain or PCI name in use
MAX_INPUT_CHARS = 32 * 1024 * 1024  # ibnetdiscover of a 10,000-HCA fabric is ~5 MB
SHOWN_CHARS = 40  # how much of a refused value an error message quotes


def shown(value: object) -> str:
    """`value` as an error message quotes it: escaped (repr) and cut short."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."


def checked_input(text: object, source: str) -> str:
    """`text` if it is a string no longer than MAX_INPUT_CHARS, else a TopologyError."""
    if not isinstance(text, str):
        raise TopologyError(source, "input", f"is {type(text).__name__}, not text")
    if len(text) > MAX_INPUT_CHARS:
        raise TopologyError(source, "input", f"{len(text)} characters, over the limit of {MAX_INPUT_CHARS}")
    return text


def checked_name(value: object, *, source: str, where: str) -> str:
    """`value` if it is an acceptable entity name (module docstring), else a TopologyError."""
    if not isinstance(value, str):
        raise TopologyError(source, where, f"a name must be text, not {type(value).__name__}")
    if not value:
        raise TopologyError(source, where, "a name is empty")
    if len(value) > MAX_NAME_CHARS:
        raise TopologyError(source, where, f"a name of {len(value)} characters, over {MAX_NAME_CHARS}")
    if not value.isprintable():
        raise TopologyError(source, where, f"name {shown(value)} holds a control or unprintable character")
    if value != value.strip():
        raise TopologyError(source, where, f"name {shown(value)} begins or ends with whitespace")
    return value


def checked_link(child: tuple[Kind, object], parent: tuple[Kind, object], *, source: str, where: str) -> Link:
    """The Link `child` -> `parent`, each given as (kind, name), both names checked."""
    return Link(
        Entity(child[0], checked_name(child[1], source=source, where=where)),
        Entity(parent[0], checked_name(parent[1], source=source, where=where)),
    )


def host_scoped(host: str, local: str) -> str:
    """The fleet-wide name of something `host` names `local` (its interface, its PCI address)."""
    return f"{host}/{local}"


def caller_host(source: str, host: str | None) -> str:
    """The host whose view a per-host input (lldpcli, virsh) shows: `host` when the caller names it (bind
    it with functools.partial), else the source file's name without its suffix ("host-005.json" ->
    "host-005"), so one saves each host's output under its host's name."""
    name = host if host is not None else PurePath(source).stem
    return checked_name(name, source=source, where="host")
