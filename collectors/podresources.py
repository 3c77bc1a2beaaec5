"""Which pod holds which GPU on this node, from the kubelet's PodResources API v1 (the gRPC `List` on
its unix socket, /var/lib/kubelet/pod-resources/kubelet.sock), as dcgm-exporter's `--kubernetes` reads it.

`list_gpu_holders` asks once: each device the NVIDIA device plugin gave a container (resource
`nvidia.com/gpu`, or a MIG profile's `nvidia.com/mig-*`) maps from its device id (the GPU's UUID,
"GPU-...", or the MIG device's, "MIG-...") to the pod, namespace and container holding it. A time-sliced
GPU's replicas ("GPU-...::3") map under the GPU's UUID; a GPU that more than one container holds that way
maps to none (no one pod to name). `PodResourcesCache` keeps the last answer for `refresh_s` so a scrape
never calls gRPC per series, and at most once per refresh.

Failure policy: anything that keeps the answer from being read (no socket, no permission, no answer in
`timeout_s`, a kubelet without v1 List, an answer too large) is a PodResourcesError naming the socket
and the cause; the cache then holds no holders until the next refresh, so GPU series go out without pod
labels rather than with stale ones. Names and ids off the kubelet's grammar are skipped one device at a
time, each reported; the others stay.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from collectors.errors import PodResourcesError
from collectors.podresources_v1 import api_pb2

SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
LIST_METHOD = "/v1.PodResourcesLister/List"
TIMEOUT_S = 2.0  # a scrape waits at most this, once per refresh, for a kubelet that does not answer
REFRESH_S = 30.0
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a node of hundreds of pods answers in kilobytes
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")  # pod names
_DNS_LABEL = re.compile(r"(?=.{1,63}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")  # namespaces, containers
# A GPU or MIG device's UUID as NVML and the device plugin write it, with a time-slicing replica suffix.
_DEVICE_ID = re.compile(r"((?:GPU|MIG)-[0-9a-fA-F-]{8,64})(?:::[0-9]{1,4})?\Z")
_FAILURES = {
    grpc.StatusCode.DEADLINE_EXCEEDED: "no answer within {timeout_s} s",
    grpc.StatusCode.UNIMPLEMENTED: "this kubelet does not serve PodResources v1 List (Kubernetes 1.20+)",
    grpc.StatusCode.RESOURCE_EXHAUSTED: f"the answer is over {MAX_ANSWER_BYTES} bytes",
    grpc.StatusCode.PERMISSION_DENIED: "permission denied",
}


@dataclass(frozen=True)
class GpuHolder:
    """The container a device is given to: dcgm-exporter's `pod`, `namespace` and `container` labels."""

    pod: str
    namespace: str
    container: str

    def labels(self) -> dict[str, str]:
        return {"pod": self.pod, "namespace": self.namespace, "container": self.container}


def list_gpu_holders(
    socket: Path = SOCKET, timeout_s: float = TIMEOUT_S, report: Callable[[str, str], None] | None = None
) -> dict[str, GpuHolder]:
    """Device id -> holder, from one List on `socket`; PodResourcesError when it cannot be read.
    `report(where, problem)` hears of each device skipped for ids or names off the kubelet's grammar."""
    answer = _list(socket, timeout_s)
    holders: dict[str, GpuHolder] = {}
    shared: set[str] = set()
    for device_id, holder in gpu_devices(answer, report or (lambda where, problem: None)):
        if device_id in holders and holders[device_id] != holder:
            shared.add(device_id)
        holders[device_id] = holder
    return {device_id: holder for device_id, holder in holders.items() if device_id not in shared}


def _list(socket: Path, timeout_s: float) -> api_pb2.ListPodResourcesResponse:
    try:
        socket.stat()
    except FileNotFoundError:
        raise PodResourcesError(
            f"{socket}: no such socket (no kubelet here, or its directory not mounted)"
        ) from None
    except OSError as error:  # EACCES on the kubelet's root-only directory
        raise PodResourcesError(
            f"{socket}: {error.strerror.lower()} (the kubelet's socket is root's)"
        ) from None
    if not os.access(socket, os.R_OK | os.W_OK):
        raise PodResourcesError(f"{socket}: permission denied (the kubelet's socket is root's)")
    options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES), ("grpc.enable_retries", 0)]
    with grpc.insecure_channel(f"unix://{socket.absolute()}", options=options) as channel:
        call = channel.unary_unary(
            LIST_METHOD,
            request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
            response_deserializer=api_pb2.ListPodResourcesResponse.FromString,
        )
        try:
            return call(api_pb2.ListPodResourcesRequest(), timeout=timeout_s)
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else None
            cause = _FAILURES.get(code, "{code}: {details}").format(
                timeout_s=timeout_s, code=getattr(code, "name", code), details=_details(error)
            )
            raise PodResourcesError(f"{socket}: List failed: {cause}") from None


def _details(error: grpc.RpcError) -> str:
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    return (details or "")[:300]


def gpu_devices(
    answer: api_pb2.ListPodResourcesResponse, report: Callable[[str, str], None]
) -> Iterator[tuple[str, GpuHolder]]:
    """(device id, holder) for each NVIDIA device of each container, the ids and names checked."""
    for pod in answer.pod_resources:
        for container in pod.containers:
            where = f"pod {pod.namespace!r:.70}/{pod.name!r:.80} container {container.name!r:.70}"
            for devices in container.devices:
                resource = devices.resource_name
                if resource != GPU_RESOURCE and not resource.startswith(MIG_RESOURCE_PREFIX):
                    continue
                holder = GpuHolder(pod.name, pod.namespace, container.name)
                if not (
                    _DNS_SUBDOMAIN.match(holder.pod)
                    and _DNS_LABEL.match(holder.namespace)
                    and _DNS_LABEL.match(holder.container)
                ):
                    report(where, "a name off the Kubernetes grammar; its GPUs go unlabelled")
                    continue
                for device_id in devices.device_ids:
                    match = _DEVICE_ID.match(device_id)
                    if match is None:
                        report(
                            where, f"device id {device_id!r:.80} of {resource!r:.40} is no GPU or MIG UUID"
                        )
                        continue
                    yield match.group(1), holder


class PodResourcesCache:
    """list_gpu_holders' answer, asked again once `refresh_s` has passed since the last ask (successful
    or not); `report(where, problem)` hears of every failure and skipped device."""

    def __init__(
        self,
        socket: Path = SOCKET,
        refresh_s: float = REFRESH_S,
        timeout_s: float = TIMEOUT_S,
        report: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._socket = socket
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._report = report or (lambda where, problem: None)
        self._clock = clock
        self._lock = threading.Lock()
        self._asked_at: float | None = None
        self._holders: dict[str, GpuHolder] = {}

    def holders(self) -> Mapping[str, GpuHolder]:
        """Device id -> holder as of the last ask; {} while the last ask failed."""
        with self._lock:
            now = self._clock()
            if self._asked_at is None or now - self._asked_at >= self._refresh_s:
                self._asked_at = now
                try:
                    self._holders = list_gpu_holders(self._socket, self._timeout_s, self._report)
                except PodResourcesError as error:
                    self._holders = {}
                    self._report(str(self._socket), str(error))
            return self._holders
