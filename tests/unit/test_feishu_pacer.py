"""The Feishu channel's pacer: at most `rate` calls per key in any one-second window at the platform, a burst at
once (Feishu's limits are counted per second: 50 calls a second per application, 5 a second per user)."""
from __future__ import annotations

import pytest

from bot.feishu import channel


class Time:
    """A monotonic clock that `asyncio.sleep` advances (the pacer sleeps real time; here no time passes)."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> Time:
    t = Time()
    monkeypatch.setattr(channel.time, "monotonic", t.monotonic)
    monkeypatch.setattr(channel.asyncio, "sleep", t.sleep)
    return t


async def test_a_burst_of_up_to_the_rate_goes_at_once_and_the_next_call_waits_for_the_window(fake_time: Time):
    pacer, starts = channel.Pacer(48.0), []
    for _ in range(50):
        async with pacer.slot("app"):
            starts.append(fake_time.now - 100.0)
    assert starts[47] == pytest.approx(0.25 * 47 / 48)  # 48 first progress cards of a busy minute: in 0.25 s
    assert starts[48:] == pytest.approx([1.0, 1.0 + 0.25 / 48])  # the 49th once the first has left the window
    assert all(sum(1 for s in starts if w <= s < w + 1.0 - 1e-9) <= 48 for w in starts)  # any window: at most 48


async def test_each_key_has_its_own_window_and_a_fractional_rate_rounds_down(fake_time: Time):
    pacer = channel.Pacer(4.8)  # Feishu's 5 QPS per user, kept under
    for _ in range(4):
        async with pacer.slot("app/ou_a"):
            pass
    spread = fake_time.now - 100.0
    async with pacer.slot("app/ou_b"):
        pass
    assert spread == pytest.approx(0.25 * 3 / 4) and fake_time.now - 100.0 == spread  # ou_b did not wait
    async with pacer.slot("app/ou_a"):
        pass
    assert fake_time.now == pytest.approx(101.0)  # ou_a's fifth call: a second after its first


async def test_keys_idle_for_a_window_are_forgotten_when_the_pacer_is_full(fake_time: Time,
                                                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(channel.Pacer, "KEYS_MAX", 3)
    pacer = channel.Pacer(5.0)
    for key in ("a", "b", "c"):
        async with pacer.slot(key):
            pass
    fake_time.now += 2.0
    async with pacer.slot("d"):
        pass
    assert set(pacer._calls) == {"d"}


async def test_the_call_after_a_full_window_starts_a_second_after_the_first_call_came_back(fake_time: Time):
    """However late a call reaches the platform, it reached it before its answer came back: a second after that,
    the platform's window holds none of the calls before it."""
    pacer, starts = channel.Pacer(2.0), []
    async with pacer.slot("app"):
        starts.append(fake_time.now)
        fake_time.now += 0.4  # a slow first call: its answer comes back 0.4 s after it started
    async with pacer.slot("app"):
        starts.append(fake_time.now)
    async with pacer.slot("app"):
        starts.append(fake_time.now)
    assert starts[2] - starts[0] == pytest.approx(1.4)  # 1 s after the first came back, not after it started
