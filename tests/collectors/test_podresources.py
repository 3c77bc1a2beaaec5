"""The PodResources client against a gRPC server on a unix socket built from the real kubelet proto."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, json_format
from hypothesis import given
from hypothesis import strategies as st

from collectors.errors import PodResourcesError
from collectors.podresources import GpuHolder, PodResourcesCache, gpu_devices, list_gpu_holders
from collectors.podresources_v1 import api_pb2
from tests.support.kubelet import PROTO, FakeKubelet, compile_proto, gpu_pod

# k8s.io/kubelet pkg/apis/podresources/v1/api.proto at github.com/kubernetes/kubelet commit
# 63b3249724f7d89a8aa48f9acb3811f193c9aa68.
KUBELET_PROTO_SHA256 = "b261f07b951c6ae807c90a3137475733a105c085d3fee62ac62199e0d986c823"
GPU0 = "GPU-8a4f3c2e-7715-3560-dcea-7238b9611a45"
GPU1 = "GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
MIG = "MIG-2ce7a541-c516-5dbc-a76e-26cc100d9b55"


@pytest.fixture(scope="module")
def server_code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_proto(tmp_path_factory.mktemp("podresources-server"))


@pytest.fixture
def socket(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "kubelet.sock"


def test_the_proto_shipped_is_the_kubelets_and_the_clients_messages_are_generated_from_it(
    server_code: Path,
) -> None:
    assert hashlib.sha256(PROTO.read_bytes()).hexdigest() == KUBELET_PROTO_SHA256
    client = descriptor_pb2.FileDescriptorProto.FromString(api_pb2.DESCRIPTOR.serialized_pb)
    [server] = descriptor_pb2.FileDescriptorSet.FromString((server_code / "api.pb").read_bytes()).file
    client.ClearField("name")
    server.ClearField("name")
    for message in server.message_type:  # protoc's descriptor set adds the JSON names gencode leaves out
        for field in message.field:
            field.ClearField("json_name")
    assert client == server


def test_each_gpu_maps_to_the_pod_namespace_and_container_holding_it(server_code: Path, socket: Path) -> None:
    pods = [
        gpu_pod("bert-worker-0", "ml", "trainer", GPU0),
        gpu_pod("mig-user", "ml", "main", MIG, resource="nvidia.com/mig-1g.10gb"),
        gpu_pod("nic-user", "net", "main", "0000:3b:00.2", resource="rdma/hca_shared_devices_a"),
        {"name": "cpu-only", "namespace": "web", "containers": [{"name": "main", "cpuIds": ["4"]}]},
    ]
    with FakeKubelet(server_code, socket, pods):
        assert list_gpu_holders(socket) == {
            GPU0: GpuHolder("bert-worker-0", "ml", "trainer"),
            MIG: GpuHolder("mig-user", "ml", "main"),
        }


def test_a_time_sliced_gpu_maps_to_its_one_holder_and_to_none_when_shared(
    server_code: Path, socket: Path
) -> None:
    pods = [
        gpu_pod("alone", "ml", "main", f"{GPU0}::0", f"{GPU0}::1"),
        gpu_pod("first", "ml", "main", f"{GPU1}::0"),
        gpu_pod("second", "ml", "main", f"{GPU1}::1"),
    ]
    with FakeKubelet(server_code, socket, pods):
        assert list_gpu_holders(socket) == {GPU0: GpuHolder("alone", "ml", "main")}


def test_a_device_with_a_hostile_name_or_id_is_skipped_and_reported_and_the_others_stay(
    server_code: Path, socket: Path
) -> None:
    pods = [
        gpu_pod("evil\nnamespace", "ml", "main", GPU1),
        gpu_pod("odd-id", "ml", "main", 'GPU-"}\n', GPU1),
        gpu_pod("good", "ml", "main", GPU0),
    ]
    reported: list[tuple[str, str]] = []
    with FakeKubelet(server_code, socket, pods):
        holders = list_gpu_holders(socket, report=lambda where, problem: reported.append((where, problem)))
    assert holders == {GPU0: GpuHolder("good", "ml", "main"), GPU1: GpuHolder("odd-id", "ml", "main")}
    assert ["evil" in where and "name" in problem for where, problem in reported] == [True, False]
    assert "odd-id" in reported[1][0] and "is no GPU or MIG UUID" in reported[1][1]


def test_no_socket_is_a_clear_error(socket: Path) -> None:
    with pytest.raises(PodResourcesError, match=r"kubelet.sock: no such socket"):
        list_gpu_holders(socket)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reaches any socket (and nobody here cannot run the venv)")
def test_an_exporter_not_root_is_told_permission_denied(server_code: Path, socket: Path) -> None:
    """Not root: a socket it may not open, or behind a directory it may not enter, as the kubelet's are."""
    with FakeKubelet(server_code, socket, []):
        socket.chmod(0)
        with pytest.raises(PodResourcesError, match=r"kubelet.sock: permission denied"):
            list_gpu_holders(socket)
        socket.parent.chmod(0)
        try:
            with pytest.raises(PodResourcesError, match=r"kubelet.sock: permission denied"):
                list_gpu_holders(socket)
        finally:
            socket.parent.chmod(0o700)


def test_a_kubelet_without_v1_list_is_a_clear_error(server_code: Path, socket: Path) -> None:
    with (
        FakeKubelet(server_code, socket, [], serves_list=False),
        pytest.raises(
            PodResourcesError, match=r"List failed: this kubelet does not serve PodResources v1 List"
        ),
    ):
        list_gpu_holders(socket)


def test_a_kubelet_that_does_not_answer_is_a_timeout(server_code: Path, socket: Path) -> None:
    with (
        FakeKubelet(server_code, socket, [], stall=True),
        pytest.raises(PodResourcesError, match=r"List failed: no answer within 0.2 s"),
    ):
        list_gpu_holders(socket, timeout_s=0.2)


def test_the_cache_asks_once_per_refresh_and_holds_nothing_while_the_kubelet_fails(
    server_code: Path, socket: Path
) -> None:
    now = [0.0]
    reported: list[str] = []
    cache = PodResourcesCache(
        socket, refresh_s=30, report=lambda where, problem: reported.append(problem), clock=lambda: now[0]
    )
    assert cache.holders() == {} and "no such socket" in reported[0]
    with FakeKubelet(server_code, socket, [gpu_pod("p", "ml", "main", GPU0)]) as kubelet:
        now[0] = 29.0
        assert cache.holders() == {}  # not asked again before the refresh is due
        now[0] = 30.0
        assert cache.holders() == {GPU0: GpuHolder("p", "ml", "main")}
        assert [cache.holders() for _ in range(5)][-1] == {GPU0: GpuHolder("p", "ml", "main")}
        assert kubelet.lists() == 1
    now[0] = 60.0
    assert cache.holders() == {}


@given(
    names=st.tuples(st.text(max_size=70), st.text(max_size=70), st.text(max_size=70)),
    device_id=st.one_of(st.text(max_size=90), st.just(GPU1), st.just(f"{GPU1}::7")),
    resource=st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-3g.40gb", "amd.com/gpu", ""]),
)
def test_whatever_the_kubelet_sends_only_grammatical_names_and_uuids_become_labels(
    names: tuple[str, str, str], device_id: str, resource: str
) -> None:
    pod, namespace, container = names
    answer = api_pb2.ListPodResourcesResponse.FromString(
        json_format.ParseDict(
            {
                "podResources": [
                    gpu_pod(pod, namespace, container, device_id, resource=resource),
                    gpu_pod("good", "ml", "main", GPU0),
                ]
            },
            api_pb2.ListPodResourcesResponse(),
        ).SerializeToString()
    )
    holders = dict(gpu_devices(answer, lambda where, problem: None))
    assert holders[GPU0] == GpuHolder("good", "ml", "main")
    for device, holder in holders.items():
        assert re.fullmatch(r"(GPU|MIG)-[0-9a-fA-F-]{8,64}", device)
        assert all(re.fullmatch(r"[a-z0-9][-a-z0-9.]*", value) for value in holder.labels().values())
