"""Networking against a real daemon: published ports, ``network="none"``, egress rules.

One sandbox (``served``) publishes guest port 8000 and runs a stock
``python3 -m http.server`` in the guest; the sync and async tests share it
and reach it from here through its host loopback port.
"""

from __future__ import annotations

import asyncio
import time
from typing import Iterator, Optional

import httpx
import pytest

import forkvm
from forkvm import AsyncClient, AsyncSandbox, Client, NetworkMode, PortForward, Sandbox, models

GUEST_PORT = 8000


def _serve(sandbox: Sandbox, text: str) -> None:
    """Start ``python3 -m http.server 8000`` in the guest, serving ``/whoami`` = ``text``."""
    sandbox.exec(
        f"mkdir -p /tmp/www && echo {text} > /tmp/www/whoami && cd /tmp/www && "
        f"(setsid python3 -m http.server {GUEST_PORT} >/dev/null 2>&1 </dev/null &)",
        check=True,
    )


def _get(port: int, path: str, timeout: float = 30.0) -> str:
    """GET ``http://127.0.0.1:<port><path>``, retrying while the guest's server starts."""
    deadline = time.monotonic() + timeout
    last: Optional[BaseException] = None
    # trust_env=False: a proxy from the environment must not intercept loopback.
    with httpx.Client(trust_env=False, timeout=10.0) as http:
        while time.monotonic() < deadline:
            try:
                response = http.get(f"http://127.0.0.1:{port}{path}")
                if response.status_code == 200:
                    return response.text
                last = AssertionError(f"HTTP {response.status_code}: {response.text[:200]}")
            except httpx.HTTPError as e:
                last = e
            time.sleep(0.25)
    raise AssertionError(f"nothing answered on 127.0.0.1:{port}{path} within {timeout:g} s: {last!r}")


def _host_port(ports, guest: int = GUEST_PORT) -> int:
    (host,) = [p.host for p in ports if p.guest == guest]
    assert host, ports
    return host


@pytest.fixture(scope="session")
def nat(client: Client) -> models.NetInfo:
    """The daemon's networking; skips the test when the host cannot give sandboxes ``nat``."""
    info = client.info().network
    if not info.available:
        pytest.skip(f"this host cannot give sandboxes a network: {info.reason}")
    return info


@pytest.fixture(scope="module")
def served(client: Client, nat: models.NetInfo) -> Iterator[Sandbox]:
    """A sandbox publishing guest port 8000 (host port allocated), with an HTTP server on it."""
    with Sandbox(ports=[{"guest": GUEST_PORT}], client=client) as sb:
        _serve(sb, sb.id)
        yield sb


# --------------------------------------------------------------------------
# sync


def test_info_network(client: Client, nat: models.NetInfo) -> None:
    assert nat.available and nat.reason is None
    assert nat.default_mode is NetworkMode.NAT
    assert "/" in nat.pool
    assert isinstance(client.info().network, models.NetInfo)


def test_published_port_serves_the_host(client: Client, served: Sandbox) -> None:
    network = served.network
    assert isinstance(network, models.NetworkInfo)
    assert network.mode is NetworkMode.NAT
    assert network.guest_ip and network.gateway and network.host_ip and network.uplink_ip
    assert network.egress is None
    port = _host_port(network.ports)
    assert served.ports() == [PortForward(guest=GUEST_PORT, host=port)]
    assert client.ports(served.id) == [PortForward(guest=GUEST_PORT, host=port)]
    assert _get(port, "/whoami") == f"{served.id}\n"
    assert "whoami" in _get(port, "/")  # the directory listing
    timings = served.info.timings
    assert timings is not None and timings.network_ms is not None and timings.network_ready_ms is not None
    assert (timings.resumed_unix_ms or 0) > 1.6e12  # a restore from the boot template: when it resumed
    refreshed = served.refresh()
    assert refreshed.network is not None and refreshed.network.ports == network.ports


def test_network_none(client: Client) -> None:
    with Sandbox(network="none", client=client) as sb:
        assert sb.network is not None and sb.network.mode is NetworkMode.NONE
        assert sb.network.ports == [] and sb.network.host_ip is None and sb.network.uplink_ip is None
        assert sb.ports() == []
        assert client.get_sandbox(sb.id).network.mode == "none"
        assert sb.exec("echo still-runs").stdout == "still-runs\n"


def test_branch_publishes_ports_for_each_child(served: Sandbox) -> None:
    source_port = _host_port(served.ports())
    branch = served.branch(count=1, ports=[GUEST_PORT], wait_for_network=True)
    try:
        (child,) = branch.children
        child_port = _host_port(child.ports())
        assert child_port != source_port
        assert child.network is not None and child.network.mode is NetworkMode.NAT
        assert _host_port(child.network.ports) == child_port
        # The server was running at the branch point: the child has one too, reached on its own port.
        child.exec(f"echo {child.id} > /tmp/www/whoami", check=True)
        assert _get(child_port, "/whoami") == f"{child.id}\n"
        assert _get(source_port, "/whoami") == f"{served.id}\n"
    finally:
        branch.close()
        branch.snapshot.delete(force=True)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"egress": ["10.0.0.1/24"]}, "host bits"),
        ({"egress": [{"cidr": "not-an-address"}]}, "IPv4"),
        ({"egress": [{"cidr": "10.0.0.0/8", "ports": [0]}]}, "port 0"),
        ({"network": "none", "ports": [GUEST_PORT]}, "need network: nat"),
        ({"network": "none", "egress": ["10.0.0.0/8"]}, "need network: nat"),
        ({"allow_host": True}, "allow_host"),
        ({"ports": [0]}, "guest port 0"),
        ({"ports": [GUEST_PORT, {"guest": GUEST_PORT}]}, "listed twice"),
        ({"count": 2, "ports": [(GUEST_PORT, 18080)]}, "cannot share host port"),
    ],
)
def test_network_errors(client: Client, nat: models.NetInfo, kwargs: dict, needle: str) -> None:
    before = {s.id for s in client.list_sandboxes().sandboxes}
    with pytest.raises(forkvm.InvalidRequest) as exc:
        client.create_sandbox(**kwargs)
    assert exc.value.status == 400 and exc.value.code == "invalid_request"
    assert needle in exc.value.message
    assert {s.id for s in client.list_sandboxes().sandboxes} <= before


def test_ports_errors(client: Client, source: Sandbox) -> None:
    with pytest.raises(forkvm.NotFound) as exc:
        client.ports("sb-000000000000")
    assert exc.value.status == 404
    with pytest.raises(forkvm.InvalidRequest):
        source.branch(count=0, ports=[0])
    with pytest.raises(ValueError):
        client.create_sandbox(network="sideways")  # refused before it is sent
    with pytest.raises(TypeError):
        client.create_sandbox(ports=GUEST_PORT)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# async


@pytest.mark.asyncio
async def test_async_ports_and_info(daemon, served: Sandbox) -> None:
    async with AsyncClient(daemon.url, daemon.token) as api:
        assert (await api.info()).network.available
        ports = await api.ports(served.id)
        assert ports == served.ports() and len(ports) == 1
        sb = await AsyncSandbox.get(served.id, client=api)
        assert sb.network is not None and sb.network.mode is NetworkMode.NAT
        assert await sb.ports() == ports
        assert await asyncio.to_thread(_get, ports[0].host, "/whoami") == f"{served.id}\n"
        with pytest.raises(forkvm.NotFound):
            await api.ports("sb-000000000000")
        with pytest.raises(forkvm.InvalidRequest) as exc:
            await api.create_sandbox(egress=["10.0.0.1/24"])
        assert "host bits" in exc.value.message


@pytest.mark.asyncio
async def test_async_egress_rules_and_no_wait(daemon, nat: models.NetInfo) -> None:
    api = AsyncClient(daemon.url, daemon.token)
    try:
        rules = ["192.0.2.0/24", {"cidr": "198.51.100.7", "ports": [443, 8443]}]
        async with AsyncSandbox(egress=rules, wait_for_network=False, client=api) as sb:
            network = sb.network
            assert network is not None and network.mode is NetworkMode.NAT
            assert network.egress == [
                models.EgressRule(cidr="192.0.2.0/24"),
                models.EgressRule(cidr="198.51.100.7", ports=[443, 8443]),
            ]
            assert network.ports == [] and await sb.ports() == []
            timings = sb.info.timings
            assert timings is not None and timings.network_ms is not None
            assert timings.network_ready_ms is None  # wait_for_network=False: not waited for
            assert (await sb.refresh()).network.egress == network.egress
    finally:
        await api.aclose()
