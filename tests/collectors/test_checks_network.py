"""The network checks against real peers: ping and iperf3 between network namespaces on a bridge, one
switch port starved or capped by a token bucket; and their output read as hostile (never PASS)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.checks.network import iperf3_pair, parse_ping, ping_mesh, ping_peer, run_local
from collectors.checks.result import Status
from collectors.commands import Completed
from collectors.errors import CollectorConfigError, CommandTimedOut
from tests.support.netpeers import FABRIC_DEV, STARVED, TEN_MBIT, fabric
from tests.support.peers import free_port, require_binary
from tests.support.strategies import JSON_VALUES

# iputils ping 20221126 over a veth, one duplicate and one ICMP error from the router
PING_LINES = [
    "PING 10.40.0.2 (10.40.0.2) from 10.40.0.1 fl0: 56(84) bytes of data.",
    "64 bytes from 10.40.0.2: icmp_seq=1 ttl=64 time=0.131 ms",
    "64 bytes from 10.40.0.2: icmp_seq=2 ttl=64 time=0.030 ms",
    "64 bytes from 10.40.0.2: icmp_seq=2 ttl=64 time=0.041 ms (DUP!)",
    "From 10.40.0.254 icmp_seq=3 Destination Host Unreachable",
    "64 bytes from 10.40.0.2: icmp_seq=4 ttl=64 time=0.036 ms",
    "",
    "--- 10.40.0.2 ping statistics ---",
    "4 packets transmitted, 3 received, +1 duplicates, +1 errors, 25% packet loss, time 603ms",
    "rtt min/avg/max/mdev = 0.030/0.059/0.131/0.041 ms, pipe 2",
]


def ping_output(rtts_ms: Sequence[float]) -> str:
    """iputils ping's output for one echo per RTT, every one answered."""
    replies = [
        f"64 bytes from 10.0.0.2: icmp_seq={seq} ttl=64 time={rtt} ms" for seq, rtt in enumerate(rtts_ms, 1)
    ]
    summary = f"{len(rtts_ms)} packets transmitted, {len(rtts_ms)} received, 0% packet loss, time 1800ms"
    return "\n".join(["PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.", *replies, "", summary, ""])


def answering(stdout: str, returncode: int = 0):
    """A runner whose command printed `stdout`: the seam for output no real peer would send."""
    return lambda argv, timeout_s: Completed(returncode, stdout, "")


IPERF3_END = {"sum_sent": {"bits_per_second": 9.7e6, "retransmits": 3}, "sum_received": {"seconds": 1.0}}


def iperf3_output(bits_per_second: object) -> str:
    end = IPERF3_END | {"sum_received": IPERF3_END["sum_received"] | {"bits_per_second": bits_per_second}}
    return json.dumps({"start": {}, "intervals": [], "end": end})


def test_ping_mesh_fails_the_peer_behind_a_starved_port_and_passes_the_clean_one() -> None:
    require_binary("ping")
    with fabric({"clean": (), "lossy": STARVED}) as net:
        peers = {name: net.addresses[name] for name in ("clean", "lossy")}
        # a p99 bound no scheduler delay reaches: loss alone decides here, whatever the machine's load
        clean, lossy = ping_mesh("node", peers, FABRIC_DEV, warn_p99_ms=1000.0, runner=net.runner("node"))
    assert (clean.target, clean.status, clean.unit) == ("peer:clean", Status.PASS, "ms")
    assert clean.evidence["received"] == 10
    assert (lossy.target, lossy.status, lossy.unit, lossy.threshold) == ("peer:lossy", Status.FAIL, "%", 0.0)
    assert lossy.value is not None and lossy.value >= 50


def test_iperf3_passes_the_clean_link_and_warns_or_fails_a_10_mbit_one_by_its_expected_rate() -> None:
    with fabric({"clean": (), "capped": TEN_MBIT}) as net:
        verdicts = {}
        for peer, expected in (("clean", 100e6), ("capped", 14e6), ("capped", 100e6)):
            with net.iperf3_server(peer):
                verdict = iperf3_pair(
                    "node", peer, net.addresses[peer], expected, seconds=1, runner=net.runner("node")
                )
            verdicts[peer, expected] = verdict
    assert verdicts["clean", 100e6].status is Status.PASS
    # 10 Mbit/s is under 90% of 14 but over half of it; a tenth of 100
    assert verdicts["capped", 14e6].status is Status.WARN
    assert verdicts["capped", 14e6].threshold == pytest.approx(0.9 * 14e6)
    assert verdicts["capped", 100e6].status is Status.FAIL
    assert verdicts["capped", 100e6].threshold == pytest.approx(0.5 * 100e6)
    assert verdicts["capped", 100e6].value < 12e6


def test_iperf3_with_no_server_listening_is_an_error_quoting_iperf3() -> None:
    require_binary("iperf3")
    verdict = iperf3_pair("node", "gone", "127.0.0.1", 1e9, seconds=1, port=free_port())
    assert verdict.status is Status.ERROR
    assert "unable to connect" in verdict.evidence["error"]


def test_a_missing_binary_is_an_error_saying_it_is_not_installed(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    verdicts = [ping_peer("node", "a", "10.0.0.2", "eth0"), iperf3_pair("node", "a", "10.0.0.2", 1e9)]
    assert [(v.status, v.evidence["error"]) for v in verdicts] == [
        (Status.ERROR, "ping is not installed (not found on PATH)"),
        (Status.ERROR, "iperf3 is not installed (not found on PATH)"),
    ]


def test_a_tool_past_its_timeout_is_an_error() -> None:
    def hung(argv: Sequence[str], timeout_s: float) -> Completed:
        raise CommandTimedOut(f"{argv[0]} ran past its {timeout_s:g} s timeout")

    verdict = ping_peer("node", "a", "10.0.0.2", "eth0", count=3, runner=hung)
    assert verdict.status is Status.ERROR
    assert verdict.evidence["error"] == "ping ran past its 11.6 s timeout"


def test_a_real_ping_transcript_counts_each_echo_once_and_its_rtts() -> None:
    stats = parse_ping("\n".join(PING_LINES), count=4)
    assert (stats.transmitted, stats.received, stats.rtts_ms) == (4, 3, (0.131, 0.030, 0.036))
    assert stats.loss_pct == 25.0


def test_a_p99_over_the_bound_warns_and_the_percentiles_are_nearest_rank() -> None:
    rtts = [0.05] * 9 + [2.5]
    verdict = ping_peer("node", "a", "10.0.0.2", "eth0", count=10, runner=answering(ping_output(rtts)))
    assert (verdict.status, verdict.value, verdict.threshold) == (Status.WARN, 2.5, 1.0)
    assert (verdict.evidence["p50_ms"], verdict.evidence["p99_ms"]) == (0.05, 2.5)


@pytest.mark.parametrize("source", ["fl0", "mlx5_2.100", "10.40.0.1", "fd00:40::1:2:3:4"])
def test_ping_goes_out_of_a_netdev_or_a_source_address(source: str) -> None:
    verdict = ping_peer("node", "a", "10.0.0.2", source, count=1, runner=answering(ping_output([0.04])))
    assert (verdict.status, verdict.evidence["device"]) == (Status.PASS, source)


@pytest.mark.parametrize(
    ("address", "device"),
    [("-f", "eth0"), ("10.0.0.2 -f", "eth0"), ("10.0.0.2", "-f"), ("10.0.0.2", "e" * 16)],
)
def test_an_address_or_netdev_that_could_pass_for_an_option_is_refused(address: str, device: str) -> None:
    with pytest.raises(CollectorConfigError):
        ping_peer("node", "a", address, device, runner=answering(""))


@given(st.text(max_size=400), st.sampled_from([0, 1, 2]))
def test_arbitrary_ping_output_is_an_error_never_a_verdict(stdout: str, returncode: int) -> None:
    verdict = ping_peer("node", "a", "10.0.0.2", "eth0", count=4, runner=answering(stdout, returncode))
    assert verdict.status is Status.ERROR
    assert verdict.evidence["error"]


@given(st.data())
def test_a_real_transcript_with_a_reply_lost_or_a_line_forged_is_an_error(data: st.DataObject) -> None:
    lines = list(PING_LINES)
    if data.draw(st.booleans(), label="drop a reply"):
        lines.pop(data.draw(st.sampled_from([1, 2, 5])))
    else:
        garbage = data.draw(
            st.text(min_size=1, max_size=80).filter(lambda line: "\n" not in line and line.strip())
        )
        lines.insert(data.draw(st.integers(0, len(lines))), garbage)
    verdict = ping_peer("node", "a", "10.0.0.2", "eth0", count=4, runner=answering("\n".join(lines)))
    assert verdict.status is Status.ERROR


@given(JSON_VALUES)
def test_arbitrary_iperf3_json_is_an_error_never_a_verdict(document: object) -> None:
    verdict = iperf3_pair("node", "a", "10.0.0.2", 1e9, runner=answering(json.dumps(document)))
    assert verdict.status is Status.ERROR


@given(st.one_of(st.text(), st.booleans(), st.none(), st.floats(max_value=-1e-9), st.just(float("nan"))))
def test_a_received_rate_that_is_not_a_number_is_an_error_naming_the_field(rate: object) -> None:
    verdict = iperf3_pair("node", "a", "10.0.0.2", 1e9, runner=answering(iperf3_output(rate)))
    assert verdict.status is Status.ERROR
    assert "end.sum_received.bits_per_second" in verdict.evidence["error"]


def test_the_real_run_local_runner_returns_the_exit_status_and_output() -> None:
    assert run_local(["sh", "-c", "echo out; echo err >&2; exit 3"], 10) == Completed(3, "out\n", "err\n")
