"""A stand-in kubelet serving the PodResources API v1 on a unix socket, compiled from the real proto.

The server's code is generated at test time by grpc_tools.protoc from the proto the client ships
(collectors/podresources_v1/api.proto, whose bytes the tests pin to kubelet's) and runs in its own process
(`python -m tests.support.kubelet`), so it shares nothing with the client's generated code: a client
whose messages differ from the proto's reads its answers wrong.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

from grpc_tools import protoc

PROTO = Path(__file__).parents[2] / "collectors/podresources_v1/api.proto"
START_TIMEOUT_S = 30.0


def compile_proto(out: Path) -> Path:
    """protoc's Python messages and gRPC service code for PROTO, in `out` (returned); its descriptor set
    in `out`/api.pb."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROTO, out / "api.proto")
    status = protoc.main(
        [
            "protoc",
            f"-I{out}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--descriptor_set_out={out / 'api.pb'}",
            str(out / "api.proto"),
        ]
    )
    assert status == 0, f"protoc failed on {PROTO}"
    return out


class FakeKubelet:
    """Serves PodResourcesLister on `socket` between `with` and its end, from the code compile_proto
    made in `code`: List answers `pods` (dicts in the proto's JSON shape: name, namespace,
    containers[].devices[].resourceName/deviceIds). With `serves_list` False the service is not
    registered (UNIMPLEMENTED, as a kubelet without v1); with `stall` List never answers. `lists()`
    counts the List calls served."""

    def __init__(
        self,
        code: Path,
        socket: Path,
        pods: list[dict[str, Any]],
        *,
        serves_list: bool = True,
        stall: bool = False,
    ) -> None:
        self.socket = socket
        self._calls = socket.with_suffix(".calls")
        spec = {"pods": pods, "serves_list": serves_list, "stall": stall, "calls": str(self._calls)}
        self._command = [
            sys.executable,
            "-m",
            "tests.support.kubelet",
            str(code),
            str(socket),
            json.dumps(spec),
        ]
        self._process: subprocess.Popen[bytes] | None = None

    def lists(self) -> int:
        return len(self._calls.read_text().splitlines()) if self._calls.exists() else 0

    def __enter__(self) -> FakeKubelet:
        self._process = subprocess.Popen(self._command, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.socket.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self._process.kill()
                raise RuntimeError(f"the fake kubelet did not start: {self._process.communicate()[1]!r}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._process is not None
        self._process.kill()
        self._process.wait()


def gpu_pod(
    name: str, namespace: str, container: str, *device_ids: str, resource: str = "nvidia.com/gpu"
) -> dict:
    """One pod whose one container the device plugin gave `device_ids` of `resource`, as the kubelet
    lists it (with the CPU ids and NUMA topology a real answer carries)."""
    devices = {"resourceName": resource, "deviceIds": list(device_ids), "topology": {"nodes": [{"ID": "0"}]}}
    return {
        "name": name,
        "namespace": namespace,
        "containers": [{"name": container, "devices": [devices], "cpuIds": ["2", "3"]}],
    }


def _serve(code: Path, socket: Path, spec: dict[str, Any]) -> None:
    """The server process: the generated PodResourcesLister, answering List from `spec`."""
    import grpc
    from google.protobuf import json_format

    sys.path.insert(0, str(code))
    import api_pb2  # type: ignore[import-not-found]
    import api_pb2_grpc  # type: ignore[import-not-found]

    stall = threading.Event()

    class Lister(api_pb2_grpc.PodResourcesListerServicer):
        def List(self, request: Any, context: grpc.ServicerContext) -> Any:
            with open(spec["calls"], "a") as calls:
                calls.write("List\n")
            if spec["stall"]:
                stall.wait()
            return json_format.ParseDict({"podResources": spec["pods"]}, api_pb2.ListPodResourcesResponse())

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    if spec["serves_list"]:
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    _serve(Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]))
