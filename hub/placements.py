"""What runs where, polled from a scheduler every POLL_S seconds and kept in the store
(Store.replace_placements: a job no longer listed ends now, a job listed as ended ends at its end time, a
new one starts at its start time): Slurm's `squeue --json` (analytics.placements.slurm) and the
Kubernetes API server's pod list (analytics.placements.kubernetes).

A poll that fails (the scheduler unreachable, failing or too slow, an answer not of its shape, the store
unavailable) is logged and changes nothing stored: the placements in force stay until a poll succeeds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from analytics.errors import PlacementError, StoreError
from analytics.placements.kubernetes import parse_pod_list
from analytics.placements.slurm import parse_squeue
from analytics.store.records import Placement
from analytics.store.topology import Changes
from analytics.topology.model import Source
from collectors import commands
from collectors.errors import CommandError
from collectors.logtext import printable
from hub.errors import PollFailed

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger("fleetlens.placements")

POLL_S = 30.0
SQUEUE = ("squeue", "--json")
SQUEUE_TIMEOUT_S = 20.0
SQUEUE_MAX_BYTES = 256 << 20  # a large cluster's squeue --json runs to tens of MiB; past this it is refused
PODS_TIMEOUT_S = 20.0
# Only pods bound to a node: the API server filters them, so a cluster's pending backlog never travels.
PODS_ON_NODES = "spec.nodeName!="


class PlacementPoller:
    """The placements `read()` returns, kept in `store` as `source`'s; the shared loop and failure policy
        of every scheduler's poller. A subclass's read() raises PollFailed when the scheduler cannot be asked,
    PlacementError when its answer is not of its shape."""

    source: Source

    def __init__(self, store: Any, wall_clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._wall_clock = wall_clock

    def read(self) -> list[Placement]:
        raise NotImplementedError

    def check(self) -> Changes | None:
        """Poll once and store what the scheduler says; what changed, or None when it failed (logged)."""
        try:
            return self._store.replace_placements(self.source, self.read(), self._wall_clock())
        except (PollFailed, PlacementError, StoreError) as exc:
            log.warning("%s placements kept as they were: %s", self.source, printable(str(exc)))
        return None

    def run(self, stop: threading.Event) -> None:
        """check() now and every POLL_S seconds until `stop` is set."""
        while True:
            self.check()
            if stop.wait(POLL_S):
                return


class SlurmPlacements(PlacementPoller):
    """The jobs `command` (squeue --json) lists, kept in `store` as the slurm source's placements; `env`
    adds to the environment squeue runs in (SLURM_CONF for a cluster other than the host's)."""

    source = Source.SLURM

    def __init__(
        self,
        store: Any,
        env: Mapping[str, str] | None = None,
        command: Sequence[str] = SQUEUE,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(store, wall_clock)
        self._env = {**os.environ, **(env or {})}
        self._command = list(command)

    def read(self) -> list[Placement]:
        what = " ".join(self._command)
        try:
            answer = commands.run(
                self._command, SQUEUE_TIMEOUT_S, max_output_bytes=SQUEUE_MAX_BYTES, env=self._env
            )
        except CommandError as exc:
            raise PollFailed(f"{what} failed: {exc}") from None
        if answer.returncode != 0:
            raise PollFailed(f"{what} exited with status {answer.returncode}: {answer.stderr[-500:]}")
        return parse_squeue(answer.stdout, source=what)


class KubernetesPlacements(PlacementPoller):
    """The pods bound to a node that the API server behind `api_client` (an official client's ApiClient;
    by default what kubectl would use) lists, kept in `store` as the k8s source's placements."""

    source = Source.KUBERNETES

    def __init__(
        self, store: Any, api_client: ApiClient | None = None, wall_clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(store, wall_clock)
        self._api_client = api_client

    def read(self) -> list[Placement]:
        from kubernetes.client import CoreV1Api  # the k8s extra, only where this poller runs
        from kubernetes.client.exceptions import OpenApiException
        from urllib3.exceptions import HTTPError

        what = "GET /api/v1/pods"
        client = self._api_client or _client_from_environment()
        try:
            answer = CoreV1Api(client).list_pod_for_all_namespaces(
                field_selector=PODS_ON_NODES, _preload_content=False, _request_timeout=PODS_TIMEOUT_S
            )
            body = answer.data
        except (OpenApiException, HTTPError, OSError) as exc:
            raise PollFailed(f"{what} failed: {str(exc)[-500:]}") from None
        finally:
            if client is not self._api_client:
                client.close()
        return parse_pod_list(body, source=what)


def _client_from_environment() -> ApiClient:
    """What kubectl would use: inside a pod its service account, elsewhere $KUBECONFIG or ~/.kube/config,
    read again at each poll (a rotated token or edited kubeconfig is picked up); PollFailed when
    there is none (so the poll fails and is retried, as for an unreachable server)."""
    import kubernetes

    kubeconfig = os.environ.get("KUBECONFIG", "~/.kube/config")
    in_pod = "KUBERNETES_SERVICE_HOST" in os.environ
    try:
        if in_pod:
            kubernetes.config.load_incluster_config()
        else:
            kubernetes.config.load_kube_config(config_file=kubeconfig)
    except kubernetes.config.ConfigException as exc:
        through = "the pod's service account" if in_pod else f"kubeconfig {kubeconfig}"
        raise PollFailed(f"kubernetes: no cluster to talk to through {through}: {exc}") from None
    return kubernetes.client.ApiClient()
