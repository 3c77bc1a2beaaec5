"""Reading another tool's JSON or XML as hostile input: parse failures, wrong shapes and (for XML)
any DOCTYPE become a TopologyError naming the source and where; nothing is fetched or expanded."""

from __future__ import annotations

import json
from typing import Any
from xml.etree.ElementTree import Element, TreeBuilder
from xml.parsers import expat

from analytics.errors import TopologyError
from analytics.topology.names import checked_input


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
