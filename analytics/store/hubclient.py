"""Read, import steps and topology, and send silences and drain requests through a hub's HTTP API: how the
UI and the CLI reach an embedded store, which only the hub process may open.

`HubClient.query`, `insert_silences` and `insert_actions` answer like the Store's, so callers take
either. What a client presents to the hub (API token, TLS client certificate) is a `HubAccess`. The
transport is a seam (`opener`), so tests can answer without a network.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from analytics.errors import (
    AddressError,
    QueryError,
    RetentionRefused,
    SettingError,
    StoreRejected,
    StoreUnavailable,
)
from analytics.store.records import ActionRow, QueryResult, SilenceRow
from analytics.store.topology import Changes

Opener = Callable[..., Any]
TOKEN_VARIABLE = "FLEETLENS_API_TOKEN"
CLIENT_CERT_VARIABLE = "FLEETLENS_HUB_CLIENT_CERT"
CLIENT_KEY_VARIABLE = "FLEETLENS_HUB_CLIENT_KEY"


@dataclass(frozen=True)
class HubAccess:
    """What a client presents to a hub: its API token, and the client certificate TLS sends.

    Each is the value the caller passes, else the environment's (FLEETLENS_API_TOKEN,
    FLEETLENS_HUB_CLIENT_CERT, FLEETLENS_HUB_CLIENT_KEY), else none. The certificate is for a hub whose
    web config asks for one (client_auth_type RequireAndVerifyClientCert); its key may sit in the
    certificate's file. The hub's own certificate is checked against the system's CAs, or SSL_CERT_FILE's.
    """

    token: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    @classmethod
    def resolve(
        cls,
        *,
        token: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> HubAccess:
        """The values given, the environment's where none is given; a key without a certificate is refused."""
        cert = client_cert or environ.get(CLIENT_CERT_VARIABLE) or None
        key = client_key or environ.get(CLIENT_KEY_VARIABLE) or None
        if key is not None and cert is None:
            raise SettingError(f"hub client key {key!r} ({CLIENT_KEY_VARIABLE}) without a certificate")
        return cls(token if token is not None else environ.get(TOKEN_VARIABLE), cert, key)

    def tls_for(self, url: str) -> ssl.SSLContext | None:
        """The TLS context for a hub at `url`: None for http://, else one that trusts the default CAs and
        presents the client certificate, if any."""
        if urllib.parse.urlsplit(url).scheme != "https":
            return None
        context = ssl.create_default_context()
        if self.client_cert is not None:
            try:
                context.load_cert_chain(self.client_cert, self.client_key)
            except (ssl.SSLError, OSError) as exc:
                raise SettingError(
                    f"hub client certificate {self.client_cert!r} ({CLIENT_CERT_VARIABLE}) and key "
                    f"{self.client_key or self.client_cert!r} ({CLIENT_KEY_VARIABLE}): no matching PEM "
                    f"certificate and key: {exc}"
                ) from None
        return context


class HubClient:
    """A hub's query and step-import endpoints, reached with `HubAccess.resolve(token=token)`: the token
    given or the environment's, and the environment's client certificate."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 60.0,
        opener: Opener | None = None,
    ) -> None:
        self.url = _checked_url(url)
        access = HubAccess.resolve(token=token)
        self._token = access.token
        self._timeout_s = timeout_s
        self._open = opener or functools.partial(urllib.request.urlopen, context=access.tls_for(self.url))

    def query(
        self, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int | None = None
    ) -> QueryResult:
        """Run read-only SQL on the hub's store; QueryError carries the hub's explanation.

        `parameters` fill `{name:Type}` placeholders as with Store.query; datetimes travel as
        ClickHouse's "YYYY-MM-DD hh:mm:ss.fff" text (UTC), which every DateTime parameter accepts."""
        body: dict[str, Any] = {"sql": sql}
        if parameters:
            body["parameters"] = {name: _wire_value(value) for name, value in parameters.items()}
        if max_rows is not None:
            body["max_rows"] = max_rows
        answer = self._post("/api/v1/sql", json.dumps(body).encode(), "application/json", QueryError)
        return QueryResult(
            columns=answer["columns"],
            types=answer["types"],
            rows=[tuple(row) for row in answer["rows"]],
            truncated=answer["truncated"],
            elapsed_s=answer["elapsed_s"],
        )

    def import_steps(self, jsonl: bytes, *, keep_days: int | None = None) -> int:
        """Send step JSON lines to the hub; returns the rows it accepted (all or nothing).

        `keep_days` keeps them that many days from now whatever their age (imported history); without it
        a body holding a record older than the steps retention is refused whole: RetentionRefused, with
        the counts and the cutoff the hub gave."""
        path = "/api/v1/steps" + ("" if keep_days is None else f"?keep_days={keep_days}")
        return self._post(path, jsonl, "application/x-ndjson", StoreRejected)["rows"]

    def import_topology(
        self, format_name: str, text: str, *, file: str, reporter: str = ""
    ) -> tuple[int, Changes]:
        """Send a topology source's `text` in `format_name` for the hub to parse and store as what
        `reporter` says now (Store.replace_links); returns the links it held and what changed.
        StoreRejected carries the hub's explanation (the file, line and key of what is wrong)."""
        body = json.dumps({"format": format_name, "text": text, "file": file, "reporter": reporter})
        answer = self._post("/api/v1/topology", body.encode(), "application/json", StoreRejected)
        return answer["links"], Changes(answer["opened"], answer["closed"], answer["unchanged"])

    def insert_checks(self, results: Sequence[Mapping[str, Any]]) -> int:
        """Send active checks' results (CheckResult fields) to the hub's `checks` table; returns how many
        it stored. StoreRejected carries the hub's explanation (the result and field it refused)."""
        body = json.dumps(results).encode()
        return self._post("/api/v1/checks", body, "application/json", StoreRejected)["stored"]

    def insert_silences(self, rows: Sequence[SilenceRow], *, token: str) -> int:
        """Store silences through the hub (as Store.insert_silences); returns the rows it accepted."""
        return self._post_rows("/api/v1/silences", rows, token)

    def insert_actions(self, rows: Sequence[ActionRow], *, token: str) -> int:
        """Send requests to the hub's drain controller (approve, deny, undrain; outcome `requested`)."""
        return self._post_rows("/api/v1/actions", rows, token)

    def _post_rows(self, path: str, rows: Sequence[Any], token: str) -> int:
        body = json.dumps({"token": token, "rows": [asdict(row) for row in rows]}).encode()
        return self._post(path, body, "application/json", StoreRejected)["rows"]

    def _post(self, path: str, body: bytes, content_type: str, refused: type[Exception]) -> dict:
        headers = {"Content-Type": content_type}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(self.url + path, data=body, headers=headers, method="POST")
        try:
            with self._open(request, timeout=self._timeout_s) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            detail = body_text = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                detail = json.loads(body_text)["error"]
            message = f"hub {self.url}{path}: {exc.code}: {detail}"
            if exc.code >= 500:
                raise StoreUnavailable(message) from None
            if exc.code == 422 and (counts := _retention_counts(body_text)) is not None:
                raise RetentionRefused(message, **counts) from None
            raise refused(message) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StoreUnavailable(f"hub {self.url} unreachable: {reason}") from None


def _retention_counts(text: str) -> dict[str, Any] | None:
    """records, stored, refused and reason of a hub's 422 for records past the retention (hub.app), or
    None when `text` is not one."""
    try:
        answer = json.loads(text)
    except ValueError:
        return None
    wanted = {"records": int, "stored": int, "refused": int, "reason": str}
    if not isinstance(answer, dict) or not all(isinstance(answer.get(k), t) for k, t in wanted.items()):
        return None
    return {key: answer[key] for key in wanted}


def _checked_url(url: str) -> str:
    """`url` without a trailing slash if it is http(s)://host[:port][/path]; AddressError naming it if not."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError as error:
        raise AddressError(f"hub URL {url!r}: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AddressError(f"hub URL {url!r}: expected http(s)://host:port, e.g. http://127.0.0.1:9500")
    return url.rstrip("/")


def _wire_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return value
