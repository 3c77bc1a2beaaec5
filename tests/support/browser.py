"""A headless Chromium (Debian's `chromium`) driven over its DevTools protocol on loopback, for tests
that look at the UI as people see it."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from itertools import count
from pathlib import Path

import websocket

from tests.support.peers import free_port, stop, wait_http


class Browser:
    """One headless Chromium tab, driven over the DevTools protocol."""

    def __init__(self, debugger_url: str) -> None:
        self._socket = websocket.create_connection(debugger_url, timeout=30, suppress_origin=True)
        self._ids = count(1)

    def call(self, method: str, **params: object) -> dict:
        sent = next(self._ids)
        self._socket.send(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            answer = json.loads(self._socket.recv())
            if answer.get("id") == sent:
                if "error" in answer:
                    raise RuntimeError(f"Chromium refused {method}: {answer['error']}")
                return answer["result"]

    def visible_text(self, url: str, wanted: Sequence[str], timeout: float = 40.0) -> str:
        """The page's visible text once every `wanted` string shows and the page has stopped changing
        (the app renders over a websocket, charts a moment later)."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        text, before = "", None
        while time.monotonic() < deadline:
            evaluated = self.call(
                "Runtime.evaluate", expression="document.body.innerText", returnByValue=True
            )
            text = evaluated["result"].get("value", "")
            if text == before and all(part in text for part in wanted):
                return text
            before = text
            time.sleep(1.0)
        missing = [part for part in wanted if part not in text]
        raise AssertionError(f"{url} never showed {missing}; it showed:\n{text}")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self._socket.close()


@contextlib.contextmanager
def chromium(binary: str, profile: Path) -> Iterator[Browser]:
    """A headless Chromium on a free loopback port for its DevTools protocol, ended by its PID after."""
    port = free_port()
    args = [binary, "--headless", "--no-sandbox", "--disable-gpu", f"--remote-debugging-port={port}"]
    args += [f"--user-data-dir={profile}", "--window-size=1400,1000", "about:blank"]
    with (profile.parent / "chromium.log").open("w") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_http(f"http://127.0.0.1:{port}/json/version", process)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as answer:
                tab = next(target for target in json.load(answer) if target["type"] == "page")
            browser = Browser(tab["webSocketDebuggerUrl"])
            yield browser
            browser.close()
        finally:
            stop(process)
