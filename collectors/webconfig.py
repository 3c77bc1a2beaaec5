"""`--web.config.file`: TLS and basic auth for the exporter and the hub, in exporter-toolkit's format.

The file node_exporter reads (docs/tls.md): `tls_server_config` (cert_file, key_file, client_ca_file,
client_auth_type, min_version, max_version), `basic_auth_users` (user: bcrypt hash) and
`http_server_config` (http2, headers). Relative paths are relative to the file's folder. Keys are checked
as strictly as the toolkit does: an unknown key is an error naming it and the file. The file and the
files it names are re-read when one of them changes (`WebConfigSource` looks once per connection, whose
request is then served under that same config); a change that makes them invalid keeps the last good
config, and says why in the log.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import logging
import os
import ssl
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from collectors.errors import WebConfigError
from collectors.logtext import printable

log = logging.getLogger("fleetlens.http")

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# client_auth_type -> OpenSSL's verify mode. The toolkit's RequestClientCert and RequireAnyClientCert take a
# certificate without verifying it, which Python's ssl cannot do: they are refused, naming the safe ones.
CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNVERIFIED_CLIENT_AUTH_TYPES = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# headers http_server_config may set, and the values each allows (None: any), as the toolkit allows them
HEADER_VALUES: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users")
TLS_FILE_KEYS = ("cert_file", "key_file", "client_ca_file")
TLS_KEYS = (*TLS_FILE_KEYS, "client_auth_type", "min_version", "max_version")
# the toolkit's keys that fleetlens does not implement: refused by name rather than silently ignored
UNSUPPORTED_KEYS = {
    "rate_limit": "rate limiting",
    "cert": "an inline certificate (use cert_file)",
    "key": "an inline key (use key_file)",
    "client_ca": "an inline client CA (use client_ca_file)",
    "cipher_suites": "cipher suite lists",
    "curve_preferences": "curve preferences",
    "client_allowed_sans": "client SAN allowlists",
    "prefer_server_cipher_suites": "cipher preference (the server's order is always used)",
}
HTTP_KEYS = ("http2", "headers")
AUTH_CACHE_SIZE = 100
AUTH_CACHE_TTL_S = 60.0
# compared against when the user is unknown, so that an unknown user costs as much as a wrong password
# (cost 10, htpasswd's and the toolkit's usual; of a random password nobody kept)
_DUMMY_HASH = b"$2b$10$uE9fH2AukzxA7RnNgx3lVe6kRECXBFM2tvlamIAr58lVNZCWA2TNa"
# the WSGI environ key under which the server hands a request the config its connection was accepted with
ENVIRON_KEY = "fleetlens.web_config"


@dataclass(frozen=True)
class WebConfig:
    """A checked web config: the TLS context to serve with (None: plain HTTP), users and extra headers."""

    path: Path
    tls: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: tuple[tuple[str, str], ...] = ()


def _mapping(value: Any, where: str, allowed: Iterable[str], path: Path) -> dict[str, Any]:
    """`value` as a mapping whose keys are all in `allowed` (None: empty), else WebConfigError naming them."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{path}: {where}: expected a mapping, got {type(value).__name__}")
    allowed = tuple(allowed)
    for key in value:
        if key in UNSUPPORTED_KEYS:
            raise WebConfigError(f"{path}: {where}.{key}: {UNSUPPORTED_KEYS[key]} is not supported")
        if key not in allowed:
            raise WebConfigError(
                f"{path}: {where}: unknown key {printable(str(key))!r} (allowed: {', '.join(allowed)})"
            )
    return value


def _string(section: Mapping[str, Any], key: str, where: str, path: Path) -> str | None:
    value = section.get(key)
    if value is not None and not isinstance(value, str):
        raise WebConfigError(f"{path}: {where}.{key}: expected a string, got {type(value).__name__}")
    return value or None


def _file(section: Mapping[str, Any], key: str, path: Path) -> Path | None:
    """The file `key` names, relative to the config's folder, checked to be a readable file."""
    name = _string(section, key, "tls_server_config", path)
    if name is None:
        return None
    target = path.parent / name
    try:
        readable = stat.S_ISREG(os.stat(target).st_mode) and os.access(target, os.R_OK)
    except (OSError, ValueError):  # missing, a name too long, a NUL byte in it
        readable = False
    if not readable:
        raise WebConfigError(
            f"{path}: tls_server_config.{key}: {printable(str(target))!r} is no readable file"
        )
    return target


def _tls_version(section: Mapping[str, Any], key: str, default: str, path: Path) -> ssl.TLSVersion:
    name = _string(section, key, "tls_server_config", path) or default
    if name not in TLS_VERSIONS:
        raise WebConfigError(
            f"{path}: tls_server_config.{key}: unknown TLS version {printable(name)!r} "
            f"(one of {', '.join(TLS_VERSIONS)})"
        )
    return TLS_VERSIONS[name]


def _tls_context(section: Mapping[str, Any], path: Path) -> ssl.SSLContext | None:
    """The server's SSLContext, or None when the section configures no TLS (as the toolkit decides)."""
    if not any(section.get(key) for key in TLS_KEYS if key not in ("min_version", "max_version")):
        return None
    cert_file, key_file = _file(section, "cert_file", path), _file(section, "key_file", path)
    if cert_file is None or key_file is None:
        raise WebConfigError(f"{path}: tls_server_config: needs both cert_file and key_file")
    auth = _string(section, "client_auth_type", "tls_server_config", path) or "NoClientCert"
    if auth in UNVERIFIED_CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"{path}: tls_server_config.client_auth_type: {auth} accepts unverified client certificates;"
            " use VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file"
        )
    if auth not in CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"{path}: tls_server_config.client_auth_type: invalid ClientAuth {printable(auth)!r} "
            f"(one of {', '.join(CLIENT_AUTH_TYPES)})"
        )
    client_ca = _file(section, "client_ca_file", path)
    if client_ca is not None and auth == "NoClientCert":
        raise WebConfigError(
            f"{path}: tls_server_config: client_ca_file is set but client_auth_type is NoClientCert"
        )
    if client_ca is None and auth != "NoClientCert":
        raise WebConfigError(f"{path}: tls_server_config.client_auth_type: {auth} needs client_ca_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _tls_version(section, "min_version", "TLS12", path)
    context.maximum_version = _tls_version(section, "max_version", "TLS13", path)
    if context.minimum_version > context.maximum_version:
        raise WebConfigError(f"{path}: tls_server_config: min_version is above max_version")
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        raise WebConfigError(
            f"{path}: tls_server_config: cert_file {str(cert_file)!r} and key_file {str(key_file)!r} "
            f"are no matching PEM certificate and key: {exc}"
        ) from None
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(
                f"{path}: tls_server_config.client_ca_file {str(client_ca)!r}: no PEM certificate: {exc}"
            ) from None
    context.verify_mode = CLIENT_AUTH_TYPES[auth]
    return context


def _users(value: Any, path: Path) -> dict[str, bytes]:
    """basic_auth_users: each a string user with a bcrypt hash (checked to be one, as the toolkit does)."""
    users = _mapping(value, "basic_auth_users", value if isinstance(value, dict) else (), path)
    checked = {}
    for user, hashed in users.items():
        if not isinstance(user, str) or not isinstance(hashed, str):
            raise WebConfigError(f"{path}: basic_auth_users: {printable(str(user))!r}: expected user: hash")
        try:
            bcrypt.checkpw(b"", hashed.encode())
        except ValueError:
            raise WebConfigError(
                f"{path}: basic_auth_users.{printable(user)}: not a bcrypt hash ($2y$10$...)"
            ) from None
        checked[user] = hashed.encode()
    return checked


def _headers(section: Mapping[str, Any], path: Path) -> tuple[tuple[str, str], ...]:
    headers = _mapping(section.get("headers"), "http_server_config.headers", HEADER_VALUES, path)
    for name, value in headers.items():
        allowed = HEADER_VALUES[name]
        unsafe = not isinstance(value, str) or any(ord(char) < 32 or ord(char) == 127 for char in value)
        if unsafe or (allowed is not None and value not in allowed):
            raise WebConfigError(
                f"{path}: http_server_config.headers.{name}: invalid value {printable(str(value))!r}"
                + (f" (one of {', '.join(allowed)})" if allowed else "")
            )
    if not isinstance(section.get("http2", True), bool):
        raise WebConfigError(f"{path}: http_server_config.http2: expected true or false")
    return tuple(headers.items())


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read and check the web config at `path`; WebConfigError names the file and the key at fault."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_bytes())
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read the web config: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not YAML: {printable(str(exc))}") from None
    top = _mapping(document, "web config", TOP_KEYS, path)
    tls = _mapping(top.get("tls_server_config"), "tls_server_config", TLS_KEYS, path)
    http = _mapping(top.get("http_server_config"), "http_server_config", HTTP_KEYS, path)
    return WebConfig(
        path, _tls_context(tls, path), _users(top.get("basic_auth_users"), path), _headers(http, path)
    )


def _signature(paths: Iterable[Path]) -> tuple[tuple[str, int, int], ...]:
    """What tells a changed file: its mtime and size (a missing one counts as changed too)."""
    marks = []
    for path in paths:
        try:
            status = path.stat()
            marks.append((str(path), status.st_mtime_ns, status.st_size))
        except (OSError, ValueError):
            marks.append((str(path), -1, -1))
    return tuple(marks)


class WebConfigSource:
    """The current web config: re-read when the file, or a certificate or key it names, changes.

    Starts from a valid config (WebConfigError otherwise); a later invalid one is logged and the last good
    config stays in force, so a half-copied certificate never takes the server down.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._config = load_web_config(self.path)
        self._watched = self._named_files()
        self._mark = _signature(self._watched)
        self._cache: OrderedDict[bytes, float] = OrderedDict()

    def _named_files(self) -> list[Path]:
        """The config file and the files it names now, valid or not: a fixed certificate is seen too."""
        section: Any = {}
        with contextlib.suppress(OSError, yaml.YAMLError, AttributeError):
            section = (yaml.safe_load(self.path.read_bytes()) or {}).get("tls_server_config") or {}
        names = [section.get(key) for key in TLS_FILE_KEYS] if isinstance(section, dict) else []
        return [self.path, *(self.path.parent / name for name in names if isinstance(name, str) and name)]

    def current(self) -> WebConfig:
        """The config in force, re-read first if any watched file changed since the last look."""
        with self._lock:
            if _signature(self._watched) != self._mark:
                self._watched = self._named_files()
                self._mark = _signature(self._watched)
                try:
                    self._config = load_web_config(self.path)
                    log.info("web config %s re-read", self.path)
                except WebConfigError as exc:
                    log.error("web config: %s; keeping the last good one", exc)
            return self._config

    def authorized(self, config: WebConfig, header: str) -> bool:
        """Whether an Authorization header carries one of `config`'s users and the right password.

        bcrypt is slow by design, so a success is remembered briefly under a digest of user, hash and
        password (a changed hash or password misses); an unknown user still pays one bcrypt check.
        """
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        hashed = config.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), hashed or b"", password.encode()))).digest()
        now = time.monotonic()
        with self._lock:
            expires = self._cache.get(key)
            if expires is not None and expires > now and hashed is not None:
                return True
        try:
            ok = bcrypt.checkpw(password.encode(), hashed or _DUMMY_HASH) and hashed is not None
        except ValueError:  # over bcrypt's 72 bytes: no hash matches it
            return False
        if ok:
            with self._lock:
                self._cache[key] = now + AUTH_CACHE_TTL_S
                self._cache.move_to_end(key)
                while len(self._cache) > AUTH_CACHE_SIZE:
                    self._cache.popitem(last=False)
        return ok

    def guard(self, app: Callable) -> Callable:
        """`app` behind the config's basic auth (401 with WWW-Authenticate) and with its extra headers.

        The config is the one the request's connection was accepted with (environ[ENVIRON_KEY]), so that a
        request looks at the files once, not twice; without it, the config in force now.
        """

        def guarded(environ: dict, start_response: Callable) -> Iterable[bytes]:
            config = environ.get(ENVIRON_KEY) or self.current()
            headers = list(config.headers)

            def respond(status: str, response_headers: list, exc_info: Any = None) -> Callable:
                return start_response(status, [*response_headers, *headers], exc_info)

            if config.users and not self.authorized(config, environ.get("HTTP_AUTHORIZATION", "")):
                log.debug("401 to %s: no or wrong basic auth credentials", environ.get("REMOTE_ADDR", "?"))
                respond(
                    "401 Unauthorized",
                    [("Content-Type", "text/plain; charset=utf-8"), ("WWW-Authenticate", "Basic")],
                )
                return [b"Unauthorized\n"]
            return app(environ, respond)

        return guarded
