"""--web.config.file: TLS, client certificates and basic auth on the exporter's (and the hub's) server.

Certificates come from the real openssl; a real Prometheus (Debian's) scrapes the exporter started from the
CLI, and plain clients (Python's ssl) check what a changed file does to a running server.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import itertools
import json
import logging
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.errors import SettingError
from analytics.store.hubclient import CLIENT_CERT_VARIABLE, CLIENT_KEY_VARIABLE, HubAccess, HubClient
from collectors.errors import WebConfigError
from collectors.httpserver import serve_app
from collectors.steprecord import StepRecord
from collectors.webconfig import TLS_KEYS, TOP_KEYS, WebConfig, WebConfigSource, load_web_config
from sim.online import StepPoster
from tests.sim.test_live import SCENARIO as LIVE_SCENARIO
from tests.support.hubserver import hub_command, hub_environment
from tests.support.peers import fleetlens_exporter, free_port, peer, prometheus, stop
from tests.support.tlscerts import CertificateAuthority, Pair

PASSWORD = "s3cret-scrape"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
_mtimes = itertools.count(1_000_000_000)


class Pki:
    """A trusted CA with a server and a client certificate, and a client certificate of another CA."""

    def __init__(self, folder: Path) -> None:
        self.ca = CertificateAuthority(folder / "ca")
        self.server = self.ca.issue("server")
        self.rotated = self.ca.issue("server-rotated")
        self.client = self.ca.issue("scraper", client=True)
        self.stranger = CertificateAuthority(folder / "other", "other-ca").issue("stranger", client=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def write(path: Path, text: str) -> Path:
    """Write `text` and give the file a new mtime, so that a re-read never hangs on the clock's grain."""
    path.write_text(text)
    stamp = next(_mtimes) * 1000
    os.utime(path, ns=(stamp, stamp))
    return path


def web_yaml(pki: Pki, *, client_auth: str = "NoClientCert", users: dict[str, str] | None = None) -> str:
    tls = {
        "cert_file": str(pki.server.cert),
        "key_file": str(pki.server.key),
        "client_auth_type": client_auth,
    }
    if client_auth != "NoClientCert":
        tls["client_ca_file"] = str(pki.ca.cert)
    document = {
        "tls_server_config": tls,
        "basic_auth_users": users if users is not None else {"prometheus": HASH},
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
    }
    return yaml.safe_dump(document)


def hello(environ: dict, start_response) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"hello over {environ['wsgi.url_scheme']}\n".encode()]


@contextlib.contextmanager
def serving(source: WebConfigSource) -> Iterator[int]:
    server = serve_app(hello, "127.0.0.1", 0, timeout_s=5, web=source)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def client_context(pki: Pki, cert: Pair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca.cert)
    if cert is not None:
        context.load_cert_chain(cert.cert, cert.key)
    return context


def get(
    port: int,
    context: ssl.SSLContext,
    user: str | None = None,
    password: str = PASSWORD,
    path: str = "/metrics",
):
    """(status, headers, body, the server certificate's CN) of a GET over TLS."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        connection.request("GET", path, headers=headers)
        subject = dict(item[0] for item in connection.sock.getpeercert()["subject"])
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read(), subject["commonName"]
    finally:
        connection.close()


def test_basic_auth_answers_401_with_a_challenge_and_lets_the_right_password_in(pki, tmp_path):
    source = WebConfigSource(write(tmp_path / "web.yml", web_yaml(pki)))
    with serving(source) as port:
        context = client_context(pki)
        refused = ((None, PASSWORD), ("prometheus", "wrong"), ("nobody", PASSWORD), ("prometheus", "x" * 100))
        for user, password in refused:
            status, headers, body, _ = get(port, context, user, password)
            assert (status, headers["WWW-Authenticate"], body) == (401, "Basic", b"Unauthorized\n")
        for _ in range(2):  # the second from the cache of successful checks
            status, headers, body, _ = get(port, context, "prometheus")
            assert (status, body) == (200, b"hello over https\n")
            assert headers["X-Content-Type-Options"] == "nosniff"


def test_client_certificates_must_come_from_the_client_ca(pki, tmp_path):
    source = WebConfigSource(
        write(tmp_path / "web.yml", web_yaml(pki, client_auth="RequireAndVerifyClientCert"))
    )
    with serving(source) as port:
        assert get(port, client_context(pki, pki.client), "prometheus")[0] == 200
        for refused in (client_context(pki), client_context(pki, pki.stranger)):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                get(port, refused, "prometheus")
        with pytest.raises(ConnectionError):  # plain HTTP on the TLS port: closed, or reset
            plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            plain.request("GET", "/metrics")
            plain.getresponse()


def test_verify_client_cert_if_given_lets_certificateless_clients_in(pki, tmp_path):
    source = WebConfigSource(
        write(tmp_path / "web.yml", web_yaml(pki, client_auth="VerifyClientCertIfGiven"))
    )
    with serving(source) as port:
        assert get(port, client_context(pki), "prometheus")[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(port, client_context(pki, pki.stranger), "prometheus")


def test_a_new_user_and_a_new_certificate_take_effect_without_a_restart(pki, tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.server.cert, cert)
    shutil.copy(pki.server.key, key)
    config = write(
        tmp_path / "web.yml",
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"},  # beside the file
                "basic_auth_users": {"prometheus": HASH},
            }
        ),
    )
    source = WebConfigSource(config)
    with serving(source) as port:
        context = client_context(pki)
        assert get(port, context, "grafana")[0] == 401
        write(
            config,
            yaml.safe_dump({**yaml.safe_load(config.read_text()), "basic_auth_users": {"grafana": HASH}}),
        )
        assert get(port, context, "grafana")[0] == 200
        assert get(port, context, "prometheus")[0] == 401  # removed with the same edit

        assert get(port, context, "grafana")[3] == "server"
        write(cert, pki.rotated.cert.read_text())
        write(key, pki.rotated.key.read_text())
        assert get(port, context, "grafana")[3] == "server-rotated"


def test_a_request_looks_at_the_config_file_once(pki, tmp_path, monkeypatch):
    config = write(tmp_path / "web.yml", web_yaml(pki))
    source = WebConfigSource(config)
    looks = []
    real_stat = Path.stat

    def counted(path: Path, *args, **kwargs) -> os.stat_result:
        if path == config:
            looks.append(path)
        return real_stat(path, *args, **kwargs)

    with serving(source) as port:
        monkeypatch.setattr(Path, "stat", counted)
        assert get(port, client_context(pki), "prometheus")[0] == 200
        assert get(port, client_context(pki), "grafana")[0] == 401
    assert len(looks) == 2  # one per request: its connection and its basic auth share one look


def test_a_config_turned_invalid_keeps_the_last_good_one_and_says_why(pki, tmp_path, caplog):
    config = write(tmp_path / "web.yml", web_yaml(pki))
    source = WebConfigSource(config)
    with serving(source) as port:
        write(config, config.read_text() + "rate_limt: {burst: 1}\n")
        with caplog.at_level(logging.ERROR, logger="fleetlens.http"):
            status, _, body, _ = get(port, client_context(pki), "prometheus")
        assert (status, body) == (200, b"hello over https\n")
        assert f"{config}: web config: unknown key 'rate_limt'" in caplog.text
        assert "keeping the last good one" in caplog.text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("tls_server_config: {cert_file: a.crt}\nbasic_auth_user: {}\n", "unknown key 'basic_auth_user'"),
        ("tls_server_config: {certfile: a.crt}\n", "tls_server_config: unknown key 'certfile'"),
        ("tls_server_config: {cert_file: nowhere.crt, key_file: k}\n", "nowhere.crt' is no readable file"),
        ("rate_limit: {interval: 1s, burst: 2}\n", "rate_limit: rate limiting is not supported"),
        ("basic_auth_users: {alice: plaintext}\n", "basic_auth_users.alice: not a bcrypt hash"),
        ("http_server_config: {headers: {X-Frame-Options: allow}}\n", "X-Frame-Options: invalid value"),
        ("http_server_config: {headers: {Set-Cookie: a}}\n", "headers: unknown key 'Set-Cookie'"),
        ('http_server_config: {headers: {X-XSS-Protection: "1\\r\\nSet-Cookie: a"}}\n', "invalid value"),
        ("- a list\n", "expected a mapping, got list"),
        ("{unclosed\n", "not YAML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path, text, problem):
    path = write(tmp_path / "web.yml", text)
    with pytest.raises(WebConfigError) as refused:
        load_web_config(path)
    assert str(refused.value).startswith(f"{path}: ")
    assert problem in str(refused.value)


def test_tls_settings_are_checked_against_each_other(pki, tmp_path):
    pair = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key)}
    for extra, problem in (
        ({"client_ca_file": str(pki.ca.cert)}, "client_ca_file is set but client_auth_type is NoClientCert"),
        (
            {"client_auth_type": "RequireAndVerifyClientCert"},
            "RequireAndVerifyClientCert needs client_ca_file",
        ),
        ({"min_version": "TLS13", "max_version": "TLS12"}, "min_version is above max_version"),
        ({"min_version": "SSL3"}, "unknown TLS version 'SSL3'"),
        ({"client_auth_type": "RequireAnyClientCert"}, "RequireAnyClientCert accepts unverified client"),
        ({"client_auth_type": "Anyone"}, "invalid ClientAuth 'Anyone'"),
        ({"key_file": str(pki.rotated.key)}, "are no matching PEM certificate and key"),
    ):
        path = write(tmp_path / "web.yml", yaml.safe_dump({"tls_server_config": {**pair, **extra}}))
        with pytest.raises(WebConfigError, match=problem):
            load_web_config(path)
    assert load_web_config(write(tmp_path / "web.yml", yaml.safe_dump({"tls_server_config": pair}))).tls
    assert load_web_config(write(tmp_path / "web.yml", "")) == WebConfig(tmp_path / "web.yml")


keys = st.sampled_from([*TOP_KEYS, *TLS_KEYS, "headers", "http2", "X-Frame-Options"]) | st.text(max_size=12)
documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=documents | st.text(max_size=60))
def test_any_document_loads_or_is_refused_naming_the_file(tmp_path, document):
    path = tmp_path / "web.yml"
    path.write_text(
        document if isinstance(document, str) else yaml.safe_dump(document), errors="surrogatepass"
    )
    try:
        assert isinstance(load_web_config(path), WebConfig)
    except WebConfigError as refused:
        assert str(refused).startswith(f"{path}: ")


def prometheus_targets(base: str) -> dict[str, dict]:
    with urllib.request.urlopen(f"{base}/api/v1/targets", timeout=5) as response:
        return {target["labels"]["job"]: target for target in json.load(response)["data"]["activeTargets"]}


def wait_settled(base: str, jobs: set[str], timeout_s: float = 60.0) -> dict[str, dict]:
    """Each job's target once the granted one is up and every other one was refused by a running exporter
    (not merely found with nothing listening yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        targets = prometheus_targets(base)
        if (
            set(targets) == jobs
            and targets["granted"]["health"] == "up"
            and all(target["health"] != "unknown" for target in targets.values())
            and not any("connection refused" in target["lastError"] for target in targets.values())
        ):
            return targets
        time.sleep(0.5)
    return prometheus_targets(base)


@pytest.mark.integration
def test_prometheus_scrapes_over_tls_with_basic_auth_and_a_client_certificate(pki, tmp_path):
    web = write(tmp_path / "web.yml", web_yaml(pki, client_auth="RequireAndVerifyClientCert"))
    args, metrics_url = fleetlens_exporter("--gpu-backend", "sim", "--web.config.file", str(web))
    target = metrics_url.removeprefix("http://").removesuffix("/metrics")
    certificate = {
        "ca_file": str(pki.ca.cert),
        "cert_file": str(pki.client.cert),
        "key_file": str(pki.client.key),
    }
    password = {"username": "prometheus", "password": PASSWORD}
    jobs = {
        "granted": {"scheme": "https", "tls_config": certificate, "basic_auth": password},
        "no_password": {"scheme": "https", "tls_config": certificate},
        "no_certificate": {
            "scheme": "https",
            "tls_config": {"ca_file": str(pki.ca.cert)},
            "basic_auth": password,
        },
        "plain_http": {"scheme": "http", "basic_auth": password},
    }
    scrape_configs = [
        {"job_name": job, "scrape_interval": "1s", "static_configs": [{"targets": [target]}], **settings}
        for job, settings in jobs.items()
    ]
    write(tmp_path / "prometheus.yml", yaml.safe_dump({"scrape_configs": scrape_configs}))
    prometheus_args, base = prometheus(tmp_path)
    with peer(prometheus_args, f"{base}/-/ready"), peer(args, f"{base}/-/ready"):
        targets = wait_settled(base, set(jobs))
    assert targets["granted"]["health"] == "up", targets["granted"]["lastError"]
    assert targets["no_password"]["health"] == "down"
    assert "401" in targets["no_password"]["lastError"]
    assert targets["no_certificate"]["health"] == "down"
    assert "certificate required" in targets["no_certificate"]["lastError"]
    assert targets["plain_http"]["health"] == "down"


def fleetlens(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "fleetlens.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=hub_environment(env))


def test_the_exporter_refuses_to_start_on_a_bad_web_config(tmp_path):
    web = write(tmp_path / "web.yml", "tls_server_config: {cert_file: gone.crt, key_file: gone.key}\n")
    result = fleetlens(
        "exporter", "--gpu-backend", "sim", "--listen", "127.0.0.1:0", "--web.config.file", str(web)
    )
    assert result.returncode == 2
    assert (
        f"exporter.web_config_file (--web.config.file): {web}: tls_server_config.cert_file:" in result.stderr
    )


def test_the_hub_refuses_basic_auth_beside_api_tokens(tmp_path):
    web = write(tmp_path / "web.yml", yaml.safe_dump({"basic_auth_users": {"prometheus": HASH}}))
    args = hub_command(tmp_path, "--web.config.file", str(web), listen="127.0.0.1:0")[3:]  # from `hub` on
    result = fleetlens(*args, env={"FLEETLENS_API_TOKEN": "a-token-of-thirty-two-characters"})
    assert result.returncode == 2
    assert "basic_auth_users and API tokens both need the Authorization header" in result.stderr


@contextlib.contextmanager
def tls_hub(tmp_path: Path, tls: dict[str, str], probe: ssl.SSLContext) -> Iterator[int]:
    """`fleetlens hub` serving its API under `tls` (a tls_server_config) on a free port, yielded once its
    /healthz answers a client with `probe`; its log in tmp_path/hub.log."""
    web = write(tmp_path / "web.yml", yaml.safe_dump({"tls_server_config": tls}))
    port = free_port()
    args = hub_command(tmp_path, "--web.config.file", str(web), listen=f"127.0.0.1:{port}")
    with (tmp_path / "hub.log").open("w") as log:
        process = subprocess.Popen(args, cwd=tmp_path, env=hub_environment(), stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        answer = None
        while answer is None and process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(ConnectionError):
                answer = get(port, probe, path="/healthz")
            time.sleep(0.2)
        assert answer is not None and answer[0] == 200, (tmp_path / "hub.log").read_text()
        yield port
    finally:
        stop(process)


def stored_steps(hub: str, job: str, env: dict[str, str], log: Path) -> int:
    """The steps of `job` the hub has stored, once there is one (its writer stores in the background);
    failing with `log`, the sender's, when none comes."""
    count = f"SELECT count() AS n FROM steps WHERE job = '{job}'"
    deadline = time.monotonic() + 60
    while (stored := fleetlens("query", "--hub", hub, count, env=env)).stdout in ("", "n\n0\n"):
        assert time.monotonic() < deadline, stored.stderr + log.read_text()
    return int(stored.stdout.removeprefix("n\n"))


def test_the_hub_serves_its_api_over_tls(pki, tmp_path):
    pair = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key)}
    with tls_hub(tmp_path, pair, client_context(pki)) as port:
        assert get(port, client_context(pki), path="/healthz")[3] == "server"
        with pytest.raises(ConnectionError):
            plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            plain.request("GET", "/healthz")
            plain.getresponse()
        hub = f"https://127.0.0.1:{port}"
        untrusted = fleetlens("query", "--hub", hub, "SELECT 1 AS one")
        assert untrusted.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
        trusting = {"SSL_CERT_FILE": str(pki.ca.cert)}
        trusted = fleetlens("query", "--hub", hub, "SELECT 1 AS one", env=trusting)
        assert (trusted.returncode, trusted.stdout) == (0, "one\n1\n"), trusted.stderr
        # the simulator's step poster (`sim serve --hub https://...`) over the same TLS
        step = StepRecord(ts=time.time(), job="tls-job", rank=0, node="vela-001", step=1, duration_s=0.5)
        with StepPoster(f"127.0.0.1:{port}", tls=client_context(pki)) as poster:
            poster.post([step])
        assert stored_steps(hub, "tls-job", trusting, tmp_path / "hub.log") == 1
    assert f"API at https://127.0.0.1:{port}" in (tmp_path / "hub.log").read_text()


def test_the_hubs_clients_present_a_client_certificate_where_the_hub_requires_one(pki, tmp_path, monkeypatch):
    tls = {
        "cert_file": str(pki.server.cert),
        "key_file": str(pki.server.key),
        "client_ca_file": str(pki.ca.cert),
        "client_auth_type": "RequireAndVerifyClientCert",
    }
    trusting = {"SSL_CERT_FILE": str(pki.ca.cert)}
    presenting = {
        **trusting,
        CLIENT_CERT_VARIABLE: str(pki.client.cert),
        CLIENT_KEY_VARIABLE: str(pki.client.key),
    }
    with tls_hub(tmp_path, tls, client_context(pki, pki.client)) as port:
        hub = f"https://127.0.0.1:{port}"
        refused = fleetlens("query", "--hub", hub, "SELECT 1 AS one", env=trusting)
        # TLS 1.3 sends the refusal after the handshake: the client reads an alert or just the close
        assert refused.returncode != 0 and f"hub {hub} unreachable" in refused.stderr, refused.stderr
        stranger = {
            **trusting,
            CLIENT_CERT_VARIABLE: str(pki.stranger.cert),
            CLIENT_KEY_VARIABLE: str(pki.stranger.key),
        }
        assert fleetlens("query", "--hub", hub, "SELECT 1 AS one", env=stranger).returncode != 0
        answered = fleetlens("query", "--hub", hub, "SELECT 1 AS one", env=presenting)
        assert (answered.returncode, answered.stdout) == (0, "one\n1\n"), answered.stderr

        # the UI's client (ui.source opens HubClient(url)) reads the same environment
        for name, value in presenting.items():
            monkeypatch.setenv(name, value)
        assert HubClient(hub).query("SELECT 1 AS one").rows == [(1,)]

        scenario = write(tmp_path / "sim.yaml", yaml.safe_dump({**LIVE_SCENARIO, "interval_s": 1}))
        with (tmp_path / "sim.log").open("w") as log:
            sim = subprocess.Popen(
                [
                    *(sys.executable, "-m", "fleetlens.cli", "sim", "serve", str(scenario)),
                    *("--file-sd", str(tmp_path / "targets.json"), "--hub", hub),
                    *("--epoch", str(time.time() - 30)),
                ],
                env=hub_environment(presenting),
                stdout=log,
                stderr=log,
            )
        try:
            assert stored_steps(hub, "small", presenting, tmp_path / "sim.log") > 0
        finally:
            stop(sim)


def test_a_client_certificate_that_does_not_load_is_refused_naming_its_files(pki):
    with pytest.raises(SettingError, match=f"{pki.client.cert}.*{pki.server.key}.*no matching PEM"):
        mismatched = HubAccess.resolve(client_cert=str(pki.client.cert), client_key=str(pki.server.key))
        mismatched.tls_for("https://hub:9500")
    with pytest.raises(SettingError, match=f"{CLIENT_KEY_VARIABLE}.*without a certificate"):
        HubAccess.resolve(environ={CLIENT_KEY_VARIABLE: str(pki.client.key)})
    flag_wins = {CLIENT_CERT_VARIABLE: "from-environment.crt", "FLEETLENS_API_TOKEN": "env-token"}
    assert HubAccess.resolve(client_cert="from-flag.crt", environ=flag_wins) == HubAccess(
        "env-token", "from-flag.crt", None
    )
