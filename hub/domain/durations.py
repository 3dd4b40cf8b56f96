"""Durations as people read them: `40 s`, `5 min`, `2 h 5 min`, `1 d 3 h` — the one formatter every message uses.

A duration shows its two largest units, rounded to the smaller one (seconds under an hour, minutes under a day,
hours beyond), so a scaled clock's `0.0111111 hours` reads `40 s` and 7,500 s reads `2 h 5 min`. Under ten seconds
it keeps a tenth (`1.5 s`), under one second two significant digits (`0.25 s`).
"""
from __future__ import annotations

from typing import NamedTuple


class Units(NamedTuple):
    """The unit words of a duration (a translated set renders the same shape in another language)."""

    day: str = "d"
    hour: str = "h"
    minute: str = "min"
    second: str = "s"


EN = Units()
_MIN, _HOUR, _DAY = 60, 3600, 86400


def duration_text(seconds: float, units: Units = EN) -> str:
    """Render `seconds` for a person: `0.25 s`, `1.5 s`, `40 s`, `1 min 30 s`, `2 h 5 min`, `4 h`, `1 d 3 h`."""
    if seconds != seconds:  # NaN
        raise ValueError("a duration must be a number of seconds")
    if seconds < 0:
        return f"-{duration_text(-seconds, units)}"
    if seconds < 1:
        return f"{seconds:.2g} {units.second}" if seconds else f"0 {units.second}"
    if seconds < 10 and round(seconds, 1) < 10:
        return f"{round(seconds, 1):g} {units.second}"
    whole = round(seconds)
    if whole < _HOUR:
        return _two(whole, _MIN, units.minute, 1, units.second)
    minutes = round(seconds / _MIN) * _MIN
    if minutes < _DAY:
        return _two(minutes, _HOUR, units.hour, _MIN, units.minute)
    return _two(round(seconds / _HOUR) * _HOUR, _DAY, units.day, _HOUR, units.hour)


def _two(total: int, big: int, big_word: str, small: int, small_word: str) -> str:
    """Render `total` seconds as `<n> big <m> small`, leaving out a zero part."""
    n, rest = divmod(total, big)
    m = rest // small
    if not n:
        return f"{m} {small_word}"
    return f"{n} {big_word} {m} {small_word}" if m else f"{n} {big_word}"
