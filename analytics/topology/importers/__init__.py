"""Parsers that turn other tools' output into topology Links, one module a format, each exposing
`parse(text, source_name) -> list[Link]` and refusing bad input whole with a TopologyError."""
