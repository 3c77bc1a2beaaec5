"""Reading another tool's JSON or XML as hostile input: parse failures, wrong shapes and (for XML)
any DOCTYPE become a TopologyError naming the source and where; nothing is fetched or expanded. The
checks the reports of fleetlens' own agents share (the host agent's, a guest's) are here too."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from typing import Any
from xml.etree.ElementTree import Element, TreeBuilder
from xml.parsers import expat

from analytics.errors import TopologyError
from analytics.topology.names import checked_input, checked_name, shown

# A PCI function as sysfs names it: domain (4 hex digits, more under VMD), bus, device (< 0x20), function.
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]")
_IFNAMSIZ = 16  # Linux's interface name buffer, NUL included
MAX_REASON_CHARS = 4096  # an agent's reason for a part left out (the host agent keeps 2,000)


def load_json(text: str, source: str) -> Any:
    """`text` parsed as JSON, or a TopologyError naming the line and column of the fault."""
    text = checked_input(text, source)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TopologyError(source, f"line {exc.lineno} column {exc.colno}", f"not JSON: {exc.msg}") from None
    except RecursionError:
        raise TopologyError(source, "input", "JSON nested too deep") from None


def expect(value: Any, kind: type, source: str, path: str) -> Any:
    """`value` if it is a `kind` (dict, list, str), else a TopologyError naming its JSON `path`."""
    if not isinstance(value, kind):
        raise TopologyError(source, path, f"is {type(value).__name__}, not {kind.__name__}")
    return value


def object_keys(
    value: Any, allowed: frozenset[str], required: frozenset[str], source: str, path: str
) -> dict:
    """`value` as an object whose keys are all `allowed` and include `required`."""
    found = expect(value, dict, source, path)
    if unknown := sorted(set(found) - allowed):
        raise TopologyError(
            source, path, f"unknown key {shown(unknown[0])}; known: {', '.join(sorted(allowed))}"
        )
    if missing := sorted(required - set(found)):
        raise TopologyError(source, path, f"no {missing[0]!r}")
    return found


def agent_report(text: str, source: str, allowed: frozenset[str], name_key: str, version: int) -> dict:
    """An agent's report `text` as an object of `allowed` keys, its "version" `version` and its
    `name_key` (whose report it is) present; TopologyError naming the JSON path otherwise."""
    report = object_keys(load_json(text, source), allowed, frozenset({"version", name_key}), source, "$")
    if type(report["version"]) is not int or report["version"] != version:
        raise TopologyError(
            source, "$.version", f"{shown(report['version'])}: this hub reads version {version}"
        )
    return report


def pci_address(value: Any, source: str, path: str) -> str:
    """`value` if it is a PCI address as sysfs writes one ("0000:3b:02.0")."""
    if not isinstance(value, str) or not _PCI_ADDRESS.fullmatch(value):
        raise TopologyError(source, path, f"{shown(value)} is not a PCI address like '0000:3b:02.0'")
    return value


def interface_name(value: Any, source: str, path: str) -> str:
    """An interface name Linux accepts (dev_valid_name): under 16 bytes, no '/', ':' or whitespace."""
    name = checked_name(value, source=source, where=path)
    if len(name.encode()) >= _IFNAMSIZ or name in (".", "..") or any(c in "/:" or c.isspace() for c in name):
        raise TopologyError(source, path, f"{shown(name)} is not a network interface name")
    return name


def reasons(errors: Any, source: str, parts: Collection[str] | Callable[[str], bool]) -> dict[str, str]:
    """An agent's `errors` object: each key one of `parts` (or one `parts` accepts), each value a one-line
    reason of at most MAX_REASON_CHARS printable characters."""
    accepts = parts if callable(parts) else parts.__contains__
    for part, reason in expect(errors, dict, source, "$.errors").items():
        if not accepts(part):
            raise TopologyError(source, "$.errors", f"{shown(part)} is not a part of the report")
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS or not reason.isprintable():
            raise TopologyError(source, f"$.errors.{part}", f"{shown(reason)} is not a one-line reason")
    return errors


class _Refused(TopologyError):
    """Raised inside expat's handlers: the document declares something an importer never reads."""


def _refuse_doctype(*_: object) -> None:
    raise _Refused("xml", "doctype", "a DOCTYPE: entity and DTD declarations are refused")


def load_xml(text: str, source: str) -> Element:
    """`text` parsed as XML into an ElementTree element, with any DOCTYPE refused (so no entity is declared,
    expanded or fetched: no billion laughs, no external entity), or a TopologyError naming the line."""
    text = checked_input(text, source)
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = _refuse_doctype
    parser.EntityDeclHandler = _refuse_doctype
    parser.ExternalEntityRefHandler = _refuse_doctype
    builder = TreeBuilder()
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(text, True)
    except _Refused as exc:
        raise TopologyError(source, f"line {parser.CurrentLineNumber}", exc.what) from None
    except expat.ExpatError as exc:
        raise TopologyError(
            source,
            f"line {exc.lineno} column {exc.offset + 1}",
            f"not XML: {expat.errors.messages[exc.code]}",
        ) from None
    return builder.close()
