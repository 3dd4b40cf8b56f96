"""The client's address: the peer, unless it is a trusted proxy; then the right-most forwarded hop not trusted."""
from __future__ import annotations

import ipaddress

import pytest

from hub.web.edge import client_address

TRUSTED = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("127.0.0.1")]

CASES = [
    # peer, X-Forwarded-For, expected
    ("198.51.100.7", None, "198.51.100.7"),                      # a direct client
    ("198.51.100.7", "203.0.113.9", "198.51.100.7"),             # an untrusted peer's header is ignored
    ("10.1.2.3", "203.0.113.9", "203.0.113.9"),                  # a trusted proxy names the client
    ("10.1.2.3", "6.6.6.6, 203.0.113.9", "203.0.113.9"),         # a forged left-most entry is not believed
    ("127.0.0.1", "203.0.113.9, 10.9.9.9", "203.0.113.9"),       # two trusted proxies in a row
    ("10.1.2.3", None, "10.1.2.3"),                              # a trusted peer sending no header
    ("10.1.2.3", "10.4.4.4", "10.4.4.4"),                        # all trusted: the farthest hop
    ("10.1.2.3", "garbage", "garbage"),                          # not an address: kept as the key, not trusted
    ("10.1.2.3", "2001:db8::1", "2001:db8::1"),
    (None, None, "-"),                                           # a Unix socket
]


@pytest.mark.parametrize("peer,forwarded,expected", CASES)
def test_the_client_is_the_peer_or_the_right_most_hop_a_trusted_proxy_forwarded(peer, forwarded, expected):
    assert client_address(peer, forwarded, TRUSTED) == expected


def test_without_trusted_proxies_the_header_is_never_read():
    assert client_address("127.0.0.1", "203.0.113.9", []) == "127.0.0.1"
