"""The errors of the CLI, its configuration and the demo, as one tree.

    FleetlensError
    ├── ConfigError        a configuration value missing, unknown or of the wrong type: names source and key
    └── DemoError          the demo cannot start or go on: what is missing, what failed, what did not answer
        ├── LinkSetupError     a namespace, veth or mount could not be made (--real-links)
        └── ChildExited        a process the demo (or a test) started ended on its own; ends with its log

`fleetlens` prints a ConfigError as a configuration error (exit 2) and `fleetlens demo` a DemoError in
one line (exit 1), instead of a traceback.
"""

from __future__ import annotations


class FleetlensError(Exception):
    """Base of every error raised by the CLI, its configuration and the demo."""


class ConfigError(FleetlensError):
    """A configuration value is missing, unknown or of the wrong type; the message says where it came from."""


class DemoError(FleetlensError):
    """The demo cannot start or go on; the message says what is missing or what failed."""


class LinkSetupError(DemoError):
    """A namespace, veth or mount could not be made; the message has the command and its answer."""


class ChildExited(DemoError):
    """A child the demo needs ended on its own; the message names it and ends with its log."""
