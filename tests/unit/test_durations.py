"""Durations people read: two largest units, rounded down."""
from __future__ import annotations

import pytest

from hub.domain.durations import readable


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"),
    (0.011, "0 s"),            # never a fraction of an hour
    (45, "45 s"),
    (300, "5 min"),            # the default stall notice
    (301, "5 min"),
    (3600, "1 h"),
    (3900, "1 h 5 min"),
    (3 * 86400 + 7200 + 59, "3 d 2 h"),
])
def test_a_duration_reads_in_its_two_largest_whole_units(seconds, text):
    assert readable(seconds) == text
