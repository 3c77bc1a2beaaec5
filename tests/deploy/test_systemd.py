"""The systemd units in deploy/systemd/: each passes `systemd-analyze verify`, scores at or below
MAX_EXPOSURE on `systemd-analyze security --offline=yes`, keeps its hardening directives, and sets only
FLEETLENS_* variables that fleetlens.config accepts.

verify resolves ExecStart, so each unit is copied with the install path (/opt/fleetlens/bin/fleetlens)
pointed at this venv's `fleetlens`; SYSTEMD_UNIT_PATH makes the copy's folder, drop-ins included, the
one systemd reads.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlens.cli import build_parser
from fleetlens.config import load_config
from tests.deploy.unitfile import last_value, read_unit
from tests.support.peers import require_binary

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
INSTALLED_FLEETLENS = "/opt/fleetlens/bin/fleetlens"
VENV_FLEETLENS = Path(sys.executable).with_name("fleetlens")
KMSG_DROP_IN = "fleetlens-exporter-kmsg.conf"
# systemd-analyze security's scale runs from 0 (locked down) to 10 (exposed); 2.0 is "OK" with margin for
# the exporter's CAP_SYSLOG drop-in (each unit's own score is in docs/deploy-systemd.md)
MAX_EXPOSURE = 2.0
SERVICES = ("fleetlens-exporter.service", "fleetlens-hub.service", "fleetlens-host-agent.service")
# what every unit must set, exactly as written here: removing or weakening one fails the test
HARDENING = {
    "DynamicUser": "yes",
    "CapabilityBoundingSet": "",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    "RestrictNamespaces": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
}
EXPOSURE_LINE = re.compile(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)")


def install(tmp_path: Path, names: tuple[str, ...]) -> Path:
    """Copy the named files of deploy/systemd to a unit folder as installed (the drop-in in its .d)."""
    for name in names:
        text = (UNITS / name).read_text(encoding="utf-8").replace(INSTALLED_FLEETLENS, str(VENV_FLEETLENS))
        target = tmp_path / name
        if name == KMSG_DROP_IN:
            target = tmp_path / "fleetlens-exporter.service.d" / "kmsg.conf"
            target.parent.mkdir(exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return tmp_path


def analyze(unit_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """systemd-analyze ARGS with only `unit_dir` (then the built-in paths) as the unit search path."""
    binary = require_binary("systemd-analyze")
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{unit_dir}:", "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run([binary, *args], cwd=unit_dir, env=env, capture_output=True, text=True, timeout=60)


def exposure(unit_dir: Path, service: str) -> float:
    """The unit's overall exposure score from `systemd-analyze security --offline=yes`."""
    done = analyze(unit_dir, "security", "--offline=yes", "--no-pager", service)
    found = EXPOSURE_LINE.search(done.stdout)
    assert found, f"no exposure score for {service}: {done.stdout[-500:]}{done.stderr}"
    return float(found.group(1))


@pytest.mark.parametrize("service", SERVICES)
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path, service: str) -> None:
    unit_dir = install(tmp_path, (service, KMSG_DROP_IN))
    done = analyze(unit_dir, "verify", "--man=no", service)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


@pytest.mark.parametrize("service", SERVICES)
def test_the_unit_scores_at_or_below_the_exposure_threshold(tmp_path: Path, service: str) -> None:
    assert exposure(install(tmp_path, (service,)), service) <= MAX_EXPOSURE


def test_the_kernel_log_drop_in_keeps_the_exporter_below_the_threshold(tmp_path: Path) -> None:
    unit_dir = install(tmp_path, ("fleetlens-exporter.service", KMSG_DROP_IN))
    assert exposure(unit_dir, "fleetlens-exporter.service") <= MAX_EXPOSURE


def test_a_unit_stripped_of_its_hardening_scores_above_the_threshold(tmp_path: Path) -> None:
    """The threshold bites: the exporter without its sandbox directives is refused."""
    kept = ("[", "Description=", "ExecStart=", "Type=", "EnvironmentFile=", "WantedBy=")
    lines = (UNITS / "fleetlens-exporter.service").read_text(encoding="utf-8").splitlines()
    stripped = "\n".join(line for line in lines if line.startswith(kept))
    (tmp_path / "fleetlens-exporter.service").write_text(stripped + "\n", encoding="utf-8")
    assert exposure(tmp_path, "fleetlens-exporter.service") > MAX_EXPOSURE


@pytest.mark.parametrize("service", SERVICES)
def test_the_unit_keeps_its_hardening_directives(service: str) -> None:
    unit = read_unit(UNITS / service)
    weakened = {
        key: last_value(unit, "Service", key)
        for key, value in HARDENING.items()
        if last_value(unit, "Service", key) != value
    }
    assert not weakened, f"{service}: hardening missing or changed: {weakened}"
    assert "@system-service" in unit["Service"]["SystemCallFilter"]
    assert not last_value(unit, "Service", "AmbientCapabilities"), f"{service} raises a capability"


def test_the_exporter_reaches_the_gpus_and_no_other_device() -> None:
    unit = read_unit(UNITS / "fleetlens-exporter.service")
    assert last_value(unit, "Service", "DevicePolicy") == "closed"
    assert unit["Service"]["DeviceAllow"] == ["char-nvidia* rw"]


def test_the_kernel_log_drop_in_grants_cap_syslog_alone() -> None:
    unit = read_unit(UNITS / KMSG_DROP_IN)
    assert last_value(unit, "Service", "AmbientCapabilities") == "CAP_SYSLOG"
    assert last_value(unit, "Service", "CapabilityBoundingSet") == "CAP_SYSLOG"
    assert unit["Service"]["DeviceAllow"] == ["/dev/kmsg r"]
    assert load_config(env=environment(UNITS / KMSG_DROP_IN)).exporter.kernel_log == Path("/dev/kmsg")


def test_the_hub_keeps_its_store_and_spool_in_its_state_directory() -> None:
    unit = read_unit(UNITS / "fleetlens-hub.service")
    assert last_value(unit, "Service", "StateDirectory") == "fleetlens"
    hub = load_config(env=environment(UNITS / "fleetlens-hub.service")).hub
    assert hub.store == "chdb:///var/lib/fleetlens/data"
    assert hub.spool_dir == Path("/var/lib/fleetlens/spool")


@pytest.mark.parametrize("service", SERVICES)
def test_the_unit_runs_a_real_fleetlens_command(service: str) -> None:
    """ExecStart parses as `fleetlens` would parse it, with the EnvironmentFile's variables filled in."""
    command = last_value(read_unit(UNITS / service), "Service", "ExecStart") or ""
    filled = command.replace("${FLEETLENS_HOST_AGENT_HUB}", "https://hub.example:9500")
    argv = shlex.split(filled.replace("$FLEETLENS_HOST_AGENT_FLAGS", ""))
    assert argv[0] == INSTALLED_FLEETLENS
    build_parser().parse_args(argv[1:])


def environment(path: Path) -> dict[str, str]:
    """The variables a unit's Environment= lines set (systemd's quoting: shell words of NAME=VALUE)."""
    assignments = read_unit(path)["Service"].get("Environment", [])
    return dict(word.split("=", 1) for line in assignments for word in shlex.split(line))
