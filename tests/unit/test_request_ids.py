"""Which `X-Request-Id` a request keeps (hub/web/edge.py): one case per rule, the rest replaced by a fresh id."""
from __future__ import annotations

import re

import pytest

from hub.web.edge import request_id_of

FRESH = re.compile(r"[0-9a-f]{16}")


@pytest.mark.parametrize("sent", [
    "a",                                    # one character is enough
    "x" * 128,                              # 128 is the longest kept
    "4f0c9a1e-2b3d-5a67-9e2f-0123456789ab",  # a UUID, as most proxies mint
    "req.42:edge_7-B",                      # every allowed punctuation: . _ : -
])
def test_a_well_formed_id_is_kept_as_sent(sent):
    assert request_id_of(sent) == sent


@pytest.mark.parametrize("sent", [
    None,                # none sent
    "",                  # empty
    "x" * 129,           # one past the limit
    "two words",         # a space
    "a;b",               # punctuation outside . _ : -
    "Root=1-67891233-abcdef012345678912345678",  # an AWS trace header: `=` is not among them
    "a/b",
    'a"b',
    "line\nbreak",       # would forge a second log line
    "é",                 # not ASCII
    "a\u2028b",          # a Unicode line separator
])
def test_anything_else_is_replaced_by_a_fresh_id(sent):
    got = request_id_of(sent)
    assert FRESH.fullmatch(got) and got != sent
    assert request_id_of(sent) != got  # fresh each time, never derived from what was sent
