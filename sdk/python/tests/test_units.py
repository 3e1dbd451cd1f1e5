"""Parts of the SDK that need no daemon: configuration, models, errors, stream parsing."""

from __future__ import annotations

import base64

import pytest

import forkvm
from forkvm import models
from forkvm import _ops
from forkvm._config import resolve_endpoint
from forkvm.client import _streaming_refused
from forkvm.errors import error_from_detail
from forkvm.streaming import ExitEvent, OutputEvent, parse_event


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("FORKVM_URL", "FORKVM_TOKEN", "FORKVM_HOME"):
        monkeypatch.delenv(name, raising=False)


def test_endpoint_defaults_to_the_local_socket(monkeypatch) -> None:
    assert resolve_endpoint().uds == "/var/lib/forkvm/forkvm.sock"
    monkeypatch.setenv("FORKVM_HOME", "/srv/fvm")
    endpoint = resolve_endpoint()
    assert endpoint.uds == "/srv/fvm/forkvm.sock" and endpoint.token is None
    assert endpoint.display == "unix:///srv/fvm/forkvm.sock"


@pytest.mark.parametrize(
    "url, uds, base",
    [
        ("unix:///run/f.sock", "/run/f.sock", "http://forkvm"),
        ("unix:/run/f.sock", "/run/f.sock", "http://forkvm"),
        ("/run/f.sock", "/run/f.sock", "http://forkvm"),
        ("http://10.0.0.2:7070/", None, "http://10.0.0.2:7070"),
        ("https://fvm.example", None, "https://fvm.example"),
    ],
)
def test_endpoint_from_url(monkeypatch, url: str, uds, base: str) -> None:
    monkeypatch.setenv("FORKVM_URL", url)
    monkeypatch.setenv("FORKVM_TOKEN", "t0k")
    endpoint = resolve_endpoint()
    assert (endpoint.uds, endpoint.base_url, endpoint.token) == (uds, base, "t0k")
    assert endpoint.headers()["Authorization"] == "Bearer t0k"


def test_endpoint_arguments_win_over_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("FORKVM_URL", "http://a:1")
    monkeypatch.setenv("FORKVM_TOKEN", "env")
    endpoint = resolve_endpoint("http://b:2", "arg")
    assert (endpoint.base_url, endpoint.token) == ("http://b:2", "arg")


@pytest.mark.parametrize("url", ["unix://relative.sock", "ftp://x", "localhost:7070"])
def test_bad_urls(url: str) -> None:
    with pytest.raises(ValueError):
        resolve_endpoint(url)


@pytest.mark.parametrize(
    "status, code, cls",
    [
        (400, "invalid_request", forkvm.InvalidRequest),
        (401, "unauthorized", forkvm.Unauthorized),
        (404, "not_found", forkvm.NotFound),
        (404, "image_not_found", forkvm.ImageNotFound),
        (405, "invalid_request", forkvm.MethodNotAllowed),
        (408, "request_timeout", forkvm.RequestTimeout),
        (409, "conflict", forkvm.Conflict),
        (413, "payload_too_large", forkvm.PayloadTooLarge),
        (422, "snapshot_corrupt", forkvm.SnapshotCorrupt),
        (429, "limit_exceeded", forkvm.LimitExceeded),
        (500, "qemu_failed", forkvm.QemuFailed),
        (500, "network_failed", forkvm.NetworkFailed),
        (503, "network_unavailable", forkvm.NetworkUnavailable),
        (500, "internal", forkvm.ServerError),
        (502, "guest_error", forkvm.GuestError),
        (504, "guest_timeout", forkvm.GuestTimeout),
        (503, "whatever", forkvm.ServerError),
        (418, "teapot", forkvm.ForkvmError),
        (None, "guest_error", forkvm.GuestError),  # from a stream's error event
    ],
)
def test_error_classes(status, code: str, cls: type) -> None:
    err = error_from_detail(code, "what to do", status)
    assert type(err) is cls and isinstance(err, forkvm.ForkvmError)
    assert (err.status, err.code, err.message) == (status, code, "what to do")


def test_models_keep_unknown_fields_and_values() -> None:
    data = {
        "id": "sb-1",
        "state": "hibernating",
        "image": "default",
        "memory_mib": 512,
        "cpus": 1,
        "accel": "tcg",
        "created_at": "2026-01-01T00:00:00Z",
        "timings": {"prepare_ms": 1, "qemu_start_ms": 2.5, "boot_ms": 0, "total_ms": 4, "new_ms": 1},
        "labels": {"a": "b"},
    }
    sb = models.Sandbox.from_dict(data)
    assert sb.state == "hibernating" and sb.extra == {"labels": {"a": "b"}}
    assert isinstance(sb.timings, models.SpawnTimings) and sb.timings.prepare_ms == 1.0
    assert isinstance(sb.timings.prepare_ms, float) and sb.timings.extra == {"new_ms": 1}
    assert models.Sandbox.from_dict(dict(data, state="running")).state is models.SandboxState.RUNNING
    with pytest.raises(ValueError):
        models.Sandbox.from_dict({"id": "sb-1"})


def test_request_models_leave_out_unset_fields() -> None:
    assert models.CreateSandbox().to_dict() == {}
    assert models.BranchRequest(mode=models.BranchMode.DIFF, count=0).to_dict() == {"mode": "diff", "count": 0}
    assert models.ExecRequest(argv=["a"], stream=True).to_dict() == {"argv": ["a"], "stream": True}


def test_network_errors_are_server_errors() -> None:
    for code, status in (("network_failed", 500), ("network_unavailable", 503)):
        err = error_from_detail(code, "m", status)
        assert isinstance(err, forkvm.ServerError) and err.status == status
    assert type(error_from_detail("network_unavailable", "m")) is forkvm.NetworkUnavailable  # no status: by code


def test_network_request_fields() -> None:
    body = _ops.create_request(
        network="nat",
        ports=[8000, (8001, 18001), {"guest": 8002}, {"guest": 8003, "host": 0}, models.PortForward(8004, 18004)],
        egress=["10.0.0.0/8", {"cidr": "1.2.3.4", "ports": [443]}, models.EgressRule("192.0.2.0/24", [53])],
        wait_for_network=False,
    )
    assert body.to_dict() == {
        "network": "nat",
        "ports": [
            {"guest": 8000},
            {"guest": 8001, "host": 18001},
            {"guest": 8002},
            {"guest": 8003, "host": 0},
            {"guest": 8004, "host": 18004},
        ],
        "egress": [
            {"cidr": "10.0.0.0/8"},
            {"cidr": "1.2.3.4", "ports": [443]},
            {"cidr": "192.0.2.0/24", "ports": [53]},
        ],
        "wait_for_network": False,
    }
    body = _ops.create_request(network=models.NetworkMode.NONE, egress=[])
    assert body.to_dict() == {"network": "none", "egress": []}
    branch = _ops.branch_request(mode="live", ports=[8000], wait_for_network=True)
    assert branch.to_dict() == {"mode": "live", "ports": [{"guest": 8000}], "wait_for_network": True}
    with pytest.raises(ValueError):
        _ops.create_request(network="bridged")
    with pytest.raises(ValueError):
        _ops.create_request(ports=[{"guest": 1, "hots": 2}])
    with pytest.raises(ValueError):
        _ops.create_request(egress=[{"network": "10.0.0.0/8"}])
    for bad in (8000, "8000", {"guest": 8000}):
        with pytest.raises(TypeError):
            _ops.create_request(ports=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _ops.create_request(egress="10.0.0.0/8")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _ops.create_request(ports=[True])


def test_set_network_request() -> None:
    """``set_network``: a list allows only its entries; ``None`` (left out) is any egress."""
    r = _ops.set_network("a b", models.SetNetwork(egress=_ops.egress_rules(["10.0.0.0/8", {"cidr": "192.0.2.1", "ports": [80]}]), allow_host=True))
    assert (r.method, r.path) == ("PUT", "/v1/sandboxes/a%20b/network")
    assert r.json == {"egress": [{"cidr": "10.0.0.0/8"}, {"cidr": "192.0.2.1", "ports": [80]}], "allow_host": True}
    assert _ops.set_network("x", models.SetNetwork()).json == {}
    assert _ops.set_network("x", models.SetNetwork(egress=[])).json == {"egress": []}


def test_network_models_from_responses() -> None:
    sb = models.Sandbox.from_dict(
        {
            "id": "sb-1",
            "state": "running",
            "image": "default",
            "memory_mib": 512,
            "cpus": 1,
            "accel": "tcg",
            "created_at": "2026-01-01T00:00:00Z",
            "timings": {
                "prepare_ms": 1,
                "qemu_start_ms": 2,
                "boot_ms": 0,
                "total_ms": 9,
                "network_ms": 3,
                "network_ready_ms": 4.5,
                "resumed_unix_ms": 1767225600000,
            },
            "network": {
                "mode": "nat",
                "guest_ip": "172.16.0.2",
                "gateway": "172.16.0.1",
                "host_ip": "10.231.0.1",
                "uplink_ip": "10.231.0.2",
                "ports": [{"guest": 8000, "host": 40001}],
                "egress": [{"cidr": "10.0.0.0/8"}, {"cidr": "1.2.3.4", "ports": [443]}],
            },
        }
    )
    net = sb.network
    assert isinstance(net, models.NetworkInfo) and net.mode is models.NetworkMode.NAT
    assert net.ports == [models.PortForward(guest=8000, host=40001)]
    assert net.egress == [models.EgressRule("10.0.0.0/8"), models.EgressRule("1.2.3.4", [443])]
    assert sb.timings.network_ms == 3.0 and isinstance(sb.timings.network_ms, float)
    assert sb.timings.network_ready_ms == 4.5 and sb.timings.resumed_unix_ms == 1767225600000.0
    info = models.NetInfo.from_dict(
        {"available": False, "reason": "no tun", "pool": "10.231.0.0/16", "default_mode": "none"}
    )
    assert info.default_mode is models.NetworkMode.NONE and info.reason == "no tun"
    none = models.NetworkInfo.from_dict(
        {"mode": "none", "guest_ip": "172.16.0.2", "gateway": "172.16.0.1", "ports": []}
    )
    assert none.host_ip is None and none.egress is None


def test_parse_events() -> None:
    data = base64.b64encode(b"hi\n").decode()
    assert parse_event(f'{{"type":"stdout","data":"{data}"}}\n') == OutputEvent("stdout", b"hi\n")
    assert parse_event(b'{"type":"stderr","data":""}') == OutputEvent("stderr", b"")
    event = parse_event(
        '{"type":"exit","exit_code":null,"signal":9,"timed_out":true,"duration_ms":12,'
        '"stdout_bytes":0,"stderr_bytes":0}'
    )
    assert event == ExitEvent(None, 12, True, 9, 0, 0) and event.type == "exit" and not event.ok
    assert parse_event("") is None
    assert parse_event('{"type":"progress","pct":50}') is None  # unknown types are skipped
    with pytest.raises(forkvm.GuestError) as exc:
        parse_event('{"type":"error","error":{"code":"guest_error","message":"the VM died"}}')
    assert exc.value.message == "the VM died" and exc.value.status is None
    with pytest.raises(forkvm.ProtocolError):
        parse_event("not json")
    with pytest.raises(forkvm.ProtocolError):
        parse_event('{"type":"stdout","data":"***"}')


def test_exec_result_helpers() -> None:
    result = models.ExecResult(
        timed_out=False,
        stdout=base64.b64encode(b"\xff").decode(),
        stderr="",
        encoding=models.OutputEncoding.BASE64,
        stdout_bytes=1,
        stderr_bytes=0,
        stdout_truncated=False,
        stderr_truncated=False,
        duration_ms=1500,
        exit_code=1,
    )
    assert result.raw_stdout == b"\xff" and result.duration == 1.5 and not result.ok
    with pytest.raises(forkvm.CommandFailed) as exc:
        result.check()
    assert "status 1" in exc.value.message and exc.value.result is result


def test_a_daemon_without_streaming_is_recognised() -> None:
    refusal = error_from_detail(
        "invalid_request", "invalid JSON body: unknown field `stream`, expected one of `argv`, `env`", 400
    )
    err = _streaming_refused(refusal)
    assert isinstance(err, forkvm.StreamingUnsupported) and isinstance(err, forkvm.InvalidRequest)
    assert err.status == 400 and "streaming" in err.message
    other = error_from_detail("invalid_request", "argv must name a program", 400)
    assert _streaming_refused(other) is other
