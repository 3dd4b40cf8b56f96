"""Every duration a person reads is printed by one function, in the largest two units that say it."""
from __future__ import annotations

import pytest

from hub.domain.durations import Units, duration_text


@pytest.mark.parametrize("seconds, text", [
    (0, "0 s"),
    (0.25, "0.25 s"),                 # under a second: two significant digits
    (1.5, "1.5 s"),                   # under ten seconds: a tenth
    (9.96, "10 s"),                   # rounds up into whole seconds
    (40, "40 s"),
    (0.0111111 * 3600, "40 s"),       # a scaled clock's "0.0111111 hours"
    (59.6, "1 min"),                  # rounding carries into the next unit
    (90, "1 min 30 s"),
    (300, "5 min"),                   # a zero part is left out
    (3599.6, "1 h"),
    (7500, "2 h 5 min"),
    (14400, "4 h"),
    (86399, "1 d"),
    (97200, "1 d 3 h"),
    (-5, "-5 s"),
])
def test_a_duration_reads_in_its_two_largest_units(seconds, text):
    assert duration_text(seconds) == text


def test_translated_units_keep_the_shape():
    assert duration_text(7500, Units("天", "小时", "分钟", "秒")) == "2 小时 5 分钟"


def test_not_a_number_is_refused():
    with pytest.raises(ValueError, match="number of seconds"):
        duration_text(float("nan"))

