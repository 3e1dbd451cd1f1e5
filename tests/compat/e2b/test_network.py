"""E2B's egress rules through the unmodified ``e2b`` SDK, mapped onto
forkvm's egress allow-list (issue 31, point 7; docs/e2b.md).

The mapping is read back through forkvm's own API (``GET /v1/sandboxes/{id}``)
rather than by reaching addresses on the internet, which the tests never
do; forkvm's network tests check that the allow-list is enforced.
"""

from __future__ import annotations

import ipaddress

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException, SandboxNotFoundException
from e2b.sandbox.network import ALL_TRAFFIC


def pid_of(daemon, sbx) -> int:
    with daemon.http() as c:
        r = c.get(f"/v1/sandboxes/{sbx.sandbox_id}")
        r.raise_for_status()
        return r.json()["pid"]


def egress_of(daemon, sbx) -> list | None:
    with daemon.http() as c:
        r = c.get(f"/v1/sandboxes/{sbx.sandbox_id}")
        r.raise_for_status()
        e = (r.json().get("network") or {}).get("egress")
        return None if e is None else [x["cidr"] for x in e]


def test_deny_all_with_allows_is_an_allow_list(e2b_env):
    sbx = Sandbox.create(
        timeout=300,
        network={"deny_out": lambda ctx: [ctx.all_traffic], "allow_out": ["192.0.2.10", "198.51.100.0/24"]},
    )
    try:
        assert egress_of(e2b_env, sbx) == ["192.0.2.10/32", "198.51.100.0/24"]
        # The sandbox runs and serves envd as usual.
        assert sbx.commands.run("echo up").stdout.strip() == "up"
    finally:
        sbx.kill()


def test_denying_one_address_allows_everything_else(e2b_env):
    sbx = Sandbox.create(timeout=300, network={"deny_out": ["192.0.2.10"]})
    try:
        nets = [ipaddress.ip_network(c) for c in egress_of(e2b_env, sbx)]
        hole = ipaddress.ip_address("192.0.2.10")
        assert not any(hole in n for n in nets)
        assert sum(n.num_addresses for n in nets) == 2**32 - 1
    finally:
        sbx.kill()


def test_no_deny_rule_restricts_nothing(e2b_env):
    sbx = Sandbox.create(timeout=300, network={"allow_out": ["192.0.2.10"]})
    try:
        assert egress_of(e2b_env, sbx) is None
    finally:
        sbx.kill()


def test_what_the_allow_list_cannot_hold_is_refused(e2b_env):
    with pytest.raises(SandboxException, match="domain name"):
        Sandbox.create(network={"deny_out": [ALL_TRAFFIC], "allow_out": ["example.com"]})


def test_update_network_changes_a_running_sandboxs_rules_in_place(e2b_env, sandbox):
    """``update_network`` replaces the allow-list of the running sandbox,
    mapped as on create; omitted fields clear, as the SDK documents."""
    assert egress_of(e2b_env, sandbox) is None
    pid = pid_of(e2b_env, sandbox)
    sandbox.update_network({"deny_out": [ALL_TRAFFIC], "allow_out": ["192.0.2.10", "198.51.100.0/24"]})
    assert egress_of(e2b_env, sandbox) == ["192.0.2.10/32", "198.51.100.0/24"]
    # allow_internet_access=False is deny_out 0.0.0.0/0: only allow_out is left.
    sandbox.update_network({"allow_internet_access": False, "allow_out": ["192.0.2.10"]})
    assert egress_of(e2b_env, sandbox) == ["192.0.2.10/32"]
    # An empty update clears every rule: any egress again.
    sandbox.update_network({})
    assert egress_of(e2b_env, sandbox) is None
    # The same sandbox, never restarted, still serving envd.
    assert pid_of(e2b_env, sandbox) == pid
    assert sandbox.commands.run("echo up").stdout.strip() == "up"


def test_update_network_refuses_what_the_allow_list_cannot_hold(e2b_env, sandbox):
    sandbox.update_network({"deny_out": [ALL_TRAFFIC]})
    with pytest.raises(SandboxException, match="domain name"):
        sandbox.update_network({"deny_out": [ALL_TRAFFIC], "allow_out": ["example.com"]})
    with pytest.raises(SandboxException, match="egress proxy"):
        sandbox.update_network({"egress_proxy": {"address": "192.0.2.10:1080"}})
    # A refused update changes nothing.
    assert egress_of(e2b_env, sandbox) == []


def test_update_network_of_an_unknown_sandbox_is_not_found(e2b_env):
    with pytest.raises(SandboxNotFoundException):
        Sandbox.update_network("no-such-sandbox", {"deny_out": [ALL_TRAFFIC]})
