"""Who may do what on the hub's API: bearer tokens with scopes, and loopback only when there are none.

    read    POST /api/v1/sql                         (the UI, `fleetlens query|detect|postmortem --hub`)
            GET|POST /api/v1/query, /api/v1/query_range   (PromQL: Grafana, promtool)
    write   POST /v1/metrics, POST /api/v1/steps     (training jobs' step times, `fleetlens steps import`)
    act     POST /api/v1/silences, /api/v1/actions   (people's silences and drain requests)

Tokens come from FLEETLENS_API_TOKEN (every scope) and from a token file (`hub.token_file`), one token
per line after the scopes it grants: `read,act <token>`, `write <token>`, `all <token>`; blank lines and
lines starting with # are skipped. A hub with no token at all serves its API to loopback clients only,
and says so when it starts; one that listens on an address other than loopback refuses to start without a
token (`fleetlens hub`, unless hub.listen_without_token says it is meant: a forgotten token otherwise
shows as every remote client's 403). GET /metrics and /healthz are open to all: they hold no data of the
fleet.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hub.errors import TokenFileError

SCOPES = ("read", "write", "act")


@dataclass(frozen=True)
class Denied:
    """Why a request may not proceed: the HTTP status (401 no or unknown token, 403 not allowed)."""

    status: int
    reason: str


@dataclass(frozen=True)
class Tokens:
    """The tokens a hub accepts and the scopes of each."""

    scopes_by_token: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def load(cls, api_token: str | None = None, token_file: Path | None = None) -> Tokens:
        """FLEETLENS_API_TOKEN's value (all scopes) and the token file's; TokenFileError for a bad file."""
        tokens: dict[str, frozenset[str]] = {}
        if token_file is not None:
            tokens.update(_read_token_file(Path(token_file)))
        if api_token:
            tokens[api_token] = frozenset(SCOPES)
        return cls(tokens)

    @property
    def configured(self) -> bool:
        return bool(self.scopes_by_token)

    def check(self, scope: str, authorization: str, client_address: str) -> Denied | None:
        """None when a request with this Authorization header from this address may use `scope`."""
        if not self.configured:
            if is_loopback(client_address):
                return None
            return Denied(
                403,
                "this hub has no API token, so it answers loopback clients only; "
                "set FLEETLENS_API_TOKEN or hub.token_file on the hub",
            )
        scopes = self._scopes_of(authorization)
        if scopes is None:
            return Denied(401, "this hub needs an API token: Authorization: Bearer <token>")
        if scope not in scopes:
            return Denied(403, f"this token may not {scope}: its scopes are {', '.join(sorted(scopes))}")
        return None

    def _scopes_of(self, authorization: str) -> frozenset[str] | None:
        """The scopes of the bearer token offered, compared in constant time against every token."""
        scheme, _, offered = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        found = None
        for token, scopes in self.scopes_by_token.items():
            if hmac.compare_digest(offered.strip().encode(), token.encode()):
                found = scopes
        return found


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback; False for anything else or not an address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def is_loopback_host(host: str) -> bool:
    """True when every address `host` resolves to is loopback; False for "" (every interface), for an
    address or name that reaches anything else, and for a name that does not resolve."""
    if not host:
        return False
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return all(is_loopback(str(address[4][0])) for address in found)


def _read_token_file(path: Path) -> dict[str, frozenset[str]]:
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as error:
        raise TokenFileError(f"token file {path}: cannot read it: {error}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokenFileError(
            f"token file {path}: readable by others (mode {stat.filemode(mode)}); chmod 600 it"
        )
    tokens: dict[str, frozenset[str]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokenFileError(
                f"token file {path}:{number}: expected '<scopes> <token>', e.g. 'read,act <token>'"
            )
        names = {name.strip() for name in parts[0].split(",")}
        scopes = set(SCOPES) if names == {"all"} else names
        if unknown := scopes - set(SCOPES):
            raise TokenFileError(
                f"token file {path}:{number}: unknown scope(s) {', '.join(sorted(unknown))}; "
                f"scopes are {', '.join(SCOPES)} or all"
            )
        tokens[parts[1]] = frozenset(scopes)
    return tokens
