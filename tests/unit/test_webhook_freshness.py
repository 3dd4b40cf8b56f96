"""Feishu inbound checks (pure): freshness for token-only applications, malformed envelopes, arbitrary input."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.feishu.webhook import FRESH_S, Rejected, open_request, signature

NOW = 1_780_000_000.0
VT = "vtok"


@dataclass
class App:
    verification_token: str | None = VT
    encrypt_key: str | None = None


def event(create_s: float, **header) -> bytes:
    return json.dumps({"schema": "2.0", "header": {"event_id": "e1", "event_type": "im.message.receive_v1",
                                                   "token": VT, "create_time": str(int(create_s * 1000)), **header},
                       "event": {}}).encode()


def test_token_only_app_takes_freshness_from_the_events_own_create_time():
    assert open_request(App(), {}, event(NOW - 10), NOW)["header"]["event_id"] == "e1"
    with pytest.raises(Rejected, match="freshness window"):
        open_request(App(), {}, event(NOW - FRESH_S - 5), NOW)


def test_token_only_app_refuses_a_stale_event_dressed_in_a_fresh_unsigned_header_timestamp():
    three_days = NOW - 3 * 86400
    with pytest.raises(Rejected, match="disagrees with the event's create_time"):
        open_request(App(), {"X-Lark-Request-Timestamp": str(int(NOW))}, event(three_days), NOW)


def test_token_only_app_refuses_an_event_without_a_creation_time():
    body = json.dumps({"header": {"event_id": "e1", "token": VT}, "event": {}}).encode()
    with pytest.raises(Rejected, match="no usable timestamp"):
        open_request(App(), {"X-Lark-Request-Timestamp": str(int(NOW))}, body, NOW)


def test_signed_app_takes_freshness_from_the_signed_header_timestamp():
    app = App(encrypt_key="ek")
    body = event(NOW)
    headers = {"X-Lark-Request-Timestamp": str(int(NOW - FRESH_S - 5)), "X-Lark-Request-Nonce": "n"}
    headers["X-Lark-Signature"] = signature(headers["X-Lark-Request-Timestamp"], "n", "ek", body)
    with pytest.raises(Rejected, match="freshness window"):
        open_request(app, headers, body, NOW)


@pytest.mark.parametrize("body", [b'{"header":"x"}', b'{"header":["x"]}', b"[1]", b"{", b'"x"'])
def test_malformed_envelopes_are_refused_not_crashed(body):
    with pytest.raises(Rejected):
        open_request(App(), {}, body, NOW)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=512) | st.recursive(
    st.none() | st.booleans() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20).map(lambda v: json.dumps(v).encode()),
    ts=st.none() | st.text(max_size=12), encrypted=st.booleans())
def test_any_input_is_either_accepted_or_rejected_never_an_unexpected_error(body, ts, encrypted):
    headers = {} if ts is None else {"X-Lark-Request-Timestamp": ts, "X-Lark-Request-Nonce": "n",
                                     "X-Lark-Signature": "s"}
    try:
        open_request(App(encrypt_key="ek" if encrypted else None), headers, body, NOW)
    except Rejected:
        pass


def _encrypted(plain: bytes, key: str, ts: float) -> tuple[dict, bytes]:
    import os

    from bot.feishu.webhook import encrypt

    body = json.dumps({"encrypt": encrypt(plain.decode(), key, os.urandom(16))}).encode()
    headers = {"X-Lark-Request-Timestamp": str(int(ts)), "X-Lark-Request-Nonce": "n1"}
    headers["X-Lark-Signature"] = signature(headers["X-Lark-Request-Timestamp"], "n1", key, body)
    return headers, body


def test_an_encrypted_signed_event_is_opened_with_lark_oapis_cipher_and_still_held_to_the_replay_window():
    app = App(encrypt_key="ek")
    headers, body = _encrypted(event(NOW), "ek", NOW)
    assert open_request(app, headers, body, NOW)["header"]["event_id"] == "e1"
    with pytest.raises(Rejected, match="freshness window"):  # a signed replay from ten minutes ago
        open_request(app, *_encrypted(event(NOW), "ek", NOW - 600), NOW)
    with pytest.raises(Rejected, match="does not decrypt"):   # another application's key
        open_request(App(encrypt_key="other"), headers, body, NOW)
    with pytest.raises(Rejected, match="does not decrypt"):   # not ciphertext at all
        open_request(app, headers, json.dumps({"encrypt": "bm90IGNpcGhlcnRleHQ="}).encode(), NOW)
    with pytest.raises(Rejected, match="signature"):          # decrypts, but the signature is not over this body
        open_request(app, {**headers, "X-Lark-Signature": "0" * 64}, body, NOW)
