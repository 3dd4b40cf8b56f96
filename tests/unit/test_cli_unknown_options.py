"""Every `amux` command refuses an option it does not know (argparse's own refusal; no `parse_known_args`)."""
from __future__ import annotations

import argparse
import contextlib
import io
from typing import Iterator

import pytest

from hub.cli import build_parser

UNKNOWN = "--permision-policy"


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], list]]:
    """Yield each leaf command's words and the arguments it requires, filled with plausible values."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001 — argparse has no public walk
    if not subs:
        needed: list[str] = []
        for action in parser._actions:  # noqa: SLF001
            value = str(action.choices[0]) if action.choices else "x"
            if not action.option_strings and action.nargs not in ("?", "*"):
                needed += [value] * (action.nargs if isinstance(action.nargs, int) else 1)
            elif action.option_strings and action.required:
                needed += [action.option_strings[0], value]
        for group in parser._mutually_exclusive_groups:  # noqa: SLF001 — a required one-of (--revoke | --restore)
            if group.required:
                first = group._group_actions[0]  # noqa: SLF001
                needed += [first.option_strings[0]] + ([] if first.nargs == 0 else ["x"])
        yield path, needed
        return
    for name, child in subs[0].choices.items():
        yield from commands(child, (*path, name))


CASES = list(commands(build_parser()))


def test_the_walk_reaches_every_command_group():
    groups = {path[0] for path, _ in CASES}
    assert {"up", "task", "schedule", "session", "token", "runner"} <= groups and len(CASES) > 30, groups


@pytest.mark.parametrize("path,needed", CASES, ids=[" ".join(p) for p, _ in CASES])
def test_every_amux_command_refuses_an_unknown_option_naming_it(path, needed):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*path, *needed, UNKNOWN, "deny-all"])
    assert exit_.value.code == 2 and f"unrecognized arguments: {UNKNOWN}" in err.getvalue(), err.getvalue()
