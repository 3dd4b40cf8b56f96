"""The scripted engine's language: one command a line."""
from __future__ import annotations

import pytest

from hub.domain import scripted
from hub.errors import Invalid


@pytest.mark.parametrize("line, op, check", [
    ("say hello world", "say", lambda s: s.text == "hello world"),
    ("tool Read 'read the file'", "tool", lambda s: s.args == ("Read", "read the file")),
    ("usage input=10 output=5", "usage", lambda s: s.numbers == (("input", 10), ("output", 5))),
    ("write dir/a.txt some text", "write", lambda s: s.args == ("dir/a.txt",) and s.text == "some text"),
    ("sleep 0.25", "sleep", lambda s: s.seconds == 0.25),
    ("ask which branch?", "ask", lambda s: s.text == "which branch?"),
    ("fail disk full", "fail", lambda s: s.text == "disk full"),
])
def test_each_command_parses(line, op, check):
    step = scripted.parse_line(line, 1)
    assert step.op == op and check(step)


def test_blank_lines_and_comments_are_ignored():
    assert [s.op for s in scripted.parse("\n# note\nsay a\n\n")] == ["say"]


@pytest.mark.parametrize("line, fix", [
    ("dance", "use one of"),
    ("usage input=-1", "key=N"),
    ("usage input", "key=N"),
    ("sleep forever", "sleep SECONDS"),
    ("sleep 999999", "sleep SECONDS"),
    ("tool", "tool NAME TITLE"),
    ("tool Read 'unclosed", "close the quote"),
    ("write", "write PATH TEXT"),
])
def test_a_bad_line_is_refused_with_its_line_number_and_an_example(line, fix):
    with pytest.raises(Invalid) as e:
        scripted.parse(f"say ok\n{line}")
    assert "line 2" in e.value.message and fix in e.value.message
