"""Many WSGI apps, each on its own port, served by one asyncio loop: the simulated fleet's HTTP front end.

A 192-node simulated fleet lives in one process. With a threaded server per node, every scrape costs a
thread and a connection (wsgiref speaks HTTP/1.0), and two scrapers polling every node each second
pile up threads faster than one Python process retires them. Here one loop thread holds every
listening socket and every keep-alive connection; only the app call runs on a small thread pool
(rendering is CPU work under the GIL either way, and a cached response returns at once).

    server = LoopServer().start()
    port = server.serve(app, "127.0.0.1")        # 0: a free port
    server.stop()                                  # closes listeners and connections, ports are free

HTTP/1.1 with keep-alive (what Prometheus and the hub's scraper use), HTTP/1.0 closes after each
response. Request bodies up to MAX_BODY_BYTES; anything unparseable gets 400 and the connection closed.
"""

from __future__ import annotations

import asyncio
import io
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus

from sim.errors import BadRequest

log = logging.getLogger("fleetlens.loopserver")

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1 << 20
_HOP_BY_HOP = {"content-length", "connection", "transfer-encoding", "keep-alive"}

Response = tuple[str, list[tuple[str, str]], bytes]


class LoopServer:
    """One event loop thread serving any number of (app, port) pairs; apps run on `workers` threads."""

    def __init__(self, workers: int = 4) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="loopserver-app")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="loopserver", daemon=True)
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.StreamWriter] = set()

    def start(self) -> LoopServer:
        self._thread.start()
        return self

    def serve(self, app: Callable, host: str, port: int = 0) -> int:
        """Listen for `app` on host:port (0: a free port) from any thread; returns the bound port."""
        future = asyncio.run_coroutine_threadsafe(self._listen(app, host, port), self._loop)
        return future.result()

    def stop(self) -> None:
        """Close every listener and connection, then end the loop and the app threads."""
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()
        self._pool.shutdown(wait=True, cancel_futures=True)

    async def _listen(self, app: Callable, host: str, port: int) -> int:
        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._converse(app, reader, writer)

        server = await asyncio.start_server(connected, host, port, limit=MAX_HEAD_BYTES)
        self._servers.append(server)
        return server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        for server in self._servers:
            server.close()
        for writer in list(self._connections):
            writer.close()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    async def _converse(
        self, app: Callable, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Answer requests on one connection until the client closes it or asks to."""
        self._connections.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client went away between requests
                except asyncio.LimitOverrunError:
                    await _send(writer, _error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "head too large"))
                    return
                try:
                    environ, keep_alive = _environ(
                        head, writer.get_extra_info("sockname"), writer.get_extra_info("peername")
                    )
                    environ["wsgi.input"] = io.BytesIO(await _read_body(reader, environ))
                except BadRequest as exc:
                    await _send(writer, _error(exc.status, str(exc)))
                    return
                response = await asyncio.get_running_loop().run_in_executor(self._pool, _call, app, environ)
                await _send(
                    writer, response, head_only=environ["REQUEST_METHOD"] == "HEAD", close=not keep_alive
                )
                if not keep_alive:
                    return
        except ConnectionError:
            pass  # the client closed while we answered
        finally:
            self._connections.discard(writer)
            writer.close()


def _environ(head: bytes, sockname: tuple, peername: tuple) -> tuple[dict, bool]:
    """The WSGI environ of one request head, and whether the connection stays open after it."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise BadRequest(HTTPStatus.BAD_REQUEST, "malformed request line") from None
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadRequest(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"unsupported version {version!r}")
    path, _, query = target.partition("?")
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": sockname[0],
        "SERVER_PORT": str(sockname[1]),
        "SERVER_PROTOCOL": version,
        "REMOTE_ADDR": peername[0],  # who asks: the hub serves its API to loopback clients without a token
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.errors": io.StringIO(),
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise BadRequest(HTTPStatus.BAD_REQUEST, f"malformed header line {line[:80]!r}")
        key = name.strip().upper().replace("-", "_")
        key = key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"
        environ[key] = value.strip()
    connection = environ.get("HTTP_CONNECTION", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return environ, keep_alive


async def _read_body(reader: asyncio.StreamReader, environ: dict) -> bytes:
    if "HTTP_TRANSFER_ENCODING" in environ:
        raise BadRequest(HTTPStatus.NOT_IMPLEMENTED, "chunked request bodies are not supported")
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise BadRequest(HTTPStatus.BAD_REQUEST, "Content-Length is not a number") from None
    if not 0 <= length <= MAX_BODY_BYTES:
        raise BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_BODY_BYTES} bytes")
    try:
        return await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError:
        raise BadRequest(HTTPStatus.BAD_REQUEST, "body shorter than Content-Length") from None


def _call(app: Callable, environ: dict) -> Response:
    """Run the WSGI app to completion; an app that raises answers 500."""
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: object = None) -> None:
        started.append((status, headers))

    try:
        result = app(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
    except Exception:
        log.exception("app failed on %s %s", environ["REQUEST_METHOD"], environ["PATH_INFO"])
        return _error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")
    status, headers = started[-1]
    return status, headers, body


def _error(status: HTTPStatus, message: str) -> Response:
    return f"{status.value} {status.phrase}", [("Content-Type", "text/plain")], f"{message}\n".encode()


async def _send(
    writer: asyncio.StreamWriter, response: Response, head_only: bool = False, close: bool = True
) -> None:
    status, headers, body = response
    lines = [f"HTTP/1.1 {status}"]
    lines += [f"{name}: {value}" for name, value in headers if name.lower() not in _HOP_BY_HOP]
    lines.append(f"Content-Length: {len(body)}")
    if close:
        lines.append("Connection: close")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    if not head_only:
        writer.write(body)
    await writer.drain()
