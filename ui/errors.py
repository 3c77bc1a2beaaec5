"""The errors of the UI, as one tree.

    UiError
    ├── SourceError    no source to read, or a setting the app cannot read: the message names the variable
    └── WindowError    a sidebar time that cannot be read, or a range that ends before it starts

Neither becomes a traceback: the page shows the message where the reader acts on it (the sidebar for a
window, the page for its source), next to the store's and the hub's own failures.
"""

from __future__ import annotations


class UiError(Exception):
    """Base of every error raised by the UI."""


class SourceError(UiError):
    """The app was started without a source, or with settings it cannot read; the message names the
    environment variable."""


class WindowError(UiError):
    """A time in the sidebar that cannot be read, or a range that ends before it starts."""
