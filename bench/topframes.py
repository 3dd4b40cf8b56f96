"""Summarize a py-spy raw profile (`py-spy record -f raw`): the top frames by own and by inclusive samples.

    python -m bench.topframes PROFILE.txt [--top 25] [--under NAME]

`AMUX_BENCH_PROFILE=DIR python -m bench.dispatch` writes one such profile per hub process (see bench/common.py).
py-spy's idle detection misses blocked waits inside containers, so stacks that end in a known wait (the event
loop's epoll, aiosqlite's, the SQLite driver's and the thread pool's queue `get`, a Condition wait) are dropped as idle.
"""
from __future__ import annotations

import argparse
import re
from collections import Counter

_SITE = re.compile(r" \(/.*?site-packages/")
_STDLIB = re.compile(r" \(/\S*?/lib/python3\.\d+/")
_REPO = re.compile(r" \(/\S*?/(hub|bot|bench|tests)/")
IDLE = (re.compile(r"^EpollSelector\.select "), re.compile(r"^Condition\.wait "),
        re.compile(r"^_connection_worker_thread \(.*aiosqlite/core\.py:59\)$"),
        re.compile(r"^_worker \(.*concurrent/futures/thread\.py:81\)$"))


def frame(text: str) -> str:
    """Shorten one frame: drop line numbers and the leading paths of site-packages, stdlib and this repo."""
    text = _SITE.sub(" (", text)
    text = _STDLIB.sub(" (py:", text)
    text = _REPO.sub(r" (\1/", text)
    return re.sub(r":\d+\)$", ")", text)


def summarize(path: str, under: str | None = None) -> tuple[int, int, Counter, Counter]:
    """Return (busy samples, idle samples, own and inclusive busy samples per frame), optionally only the stacks
    through `under`."""
    own: Counter = Counter()
    incl: Counter = Counter()
    total = idle = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            raw = stack.split(";")
            n = int(count)
            if any(p.search(raw[-1]) for p in IDLE):
                idle += n
                continue
            frames = [frame(x) for x in raw]
            if under and not any(under in x for x in frames):
                continue
            total += n
            own[frames[-1]] += n
            for x in set(frames):
                incl[x] += n
    return total, idle, own, incl


def main() -> None:
    """Print the summary."""
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--under", help="only stacks that pass through a frame containing this text")
    a = ap.parse_args()
    total, idle, own, incl = summarize(a.profile, a.under)
    print(f"{a.profile}: {total} busy samples" + (f" under {a.under!r}" if a.under else "") + f" ({idle} idle dropped)")
    print("own time (the frame itself):")
    for name, n in own.most_common(a.top):
        print(f"  {100 * n / max(total, 1):5.1f} %  {name}")
    print("inclusive (the frame and what it calls):")
    for name, n in incl.most_common(a.top):
        print(f"  {100 * n / max(total, 1):5.1f} %  {name}")


if __name__ == "__main__":
    main()
