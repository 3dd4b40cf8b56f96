"""The egress proxy of an isolated linux-dac child connects to public addresses only, unless the operator allows."""
from __future__ import annotations

from pathlib import Path

import pytest

from hub.runner.egress import Egress, public


@pytest.mark.parametrize(("address", "ok"), [
    ("93.184.216.34", True), ("2606:4700::1111", True),
    ("127.0.0.1", False), ("::1", False), ("10.1.2.3", False), ("192.168.0.9", False), ("172.16.0.1", False),
    ("169.254.169.254", False),  # the cloud metadata endpoint
    ("100.64.0.1", False), ("0.0.0.0", False), ("224.0.0.1", False), ("::ffff:127.0.0.1", False),
])
def test_only_public_addresses_are_reachable_through_the_egress_proxy(address, ok):
    assert public(address) is ok


def test_the_operators_allow_list_names_a_host_or_a_host_and_port():
    e = Egress(Path("/unused"), None, ["db.internal:5432", "Registry.Local"])
    assert e.allowed("db.internal", 5432) and not e.allowed("db.internal", 22)
    assert e.allowed("registry.local", 443)
