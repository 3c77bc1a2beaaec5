"""One POST through a hub's WSGI app, as its server calls it, from a loopback client: for tests of what
the hub answers without a listening socket."""

from __future__ import annotations

import io
from collections.abc import Mapping

from hub.app import Hub


def wsgi_post(
    hub: Hub,
    path: str,
    body: bytes,
    content_type: str = "",
    *,
    environ: Mapping[str, str] | None = None,
    length: str | None = None,
) -> tuple[int, bytes]:
    """(status, answer) of one POST; `environ` adds CGI variables (HTTP_CONTENT_ENCODING, ...), `length`
    sends a Content-Length other than the body's."""
    statuses: list[int] = []
    request = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": content_type,
        "CONTENT_LENGTH": str(len(body)) if length is None else length,
        "wsgi.input": io.BytesIO(body),
        **(environ or {}),
    }
    answer = b"".join(hub.app(request, lambda status, headers: statuses.append(int(status.split()[0]))))
    return statuses[0], answer
