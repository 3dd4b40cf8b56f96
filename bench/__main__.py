"""Run every benchmark in turn: `.venv/bin/python -m bench [NAME ...] [--compare OLD.json]` (or `make bench`).

Each benchmark runs in its own interpreter and prints its lines; every figure (value, floor, ratio, target) is
also written to bench/results.json (`--out` to change), so two runs can be compared: `--compare OLD.json` prints
each figure's old and new value after the run, and `--diff OLD.json NEW.json` compares two files without running.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import OUT_ENV

HERE = Path(__file__).parent
HELPERS = ("__init__", "__main__", "common", "bare_mcp", "bare_web", "topframes")
BENCHES = [p.stem for p in sorted(HERE.glob("*.py")) if p.stem not in HELPERS]


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def run(names: list[str], out: Path) -> int:
    """Run the named benchmarks (all by default), each in its own interpreter; write their figures to `out`."""
    status = 0
    started = time.time()
    with tempfile.NamedTemporaryFile("w+", suffix=".jsonl", delete=False) as lines:
        env = {**os.environ, OUT_ENV: lines.name}
        for name in names:
            t0 = time.monotonic()
            status |= subprocess.call([sys.executable, "-m", f"bench.{name}"], cwd=HERE.parent, env=env)
            print(f"  ({name}: {time.monotonic() - t0:.0f} s)", flush=True)
        figures = [json.loads(line) for line in Path(lines.name).read_text().splitlines() if line.strip()]
    os.unlink(lines.name)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    doc = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
           "seconds": round(time.time() - started, 1), "commit": _git_commit(), "benches": names,
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                       "load_after": load},
           "figures": {f.pop("key"): f for f in figures}}
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"figures written to {out} ({len(figures)} figures, {doc['seconds']:.0f} s)")
    return status


def diff(old_path: Path, new_path: Path) -> None:
    """Print each figure of both files: old → new value, change, ratio against its target."""
    old, new = (json.loads(p.read_text()) for p in (old_path, new_path))
    print(f"compare {old_path} (commit {old.get('commit')}, {old.get('started_at')}) → {new_path} "
          f"(commit {new.get('commit')}, {new.get('started_at')})")
    for key in sorted(set(old["figures"]) | set(new["figures"])):
        a, b = old["figures"].get(key), new["figures"].get(key)
        if a is None or b is None:
            print(f"  {key:<42} {'only in the new run' if a is None else 'only in the old run'}")
            continue
        change = f"{(b['value'] - a['value']) / a['value'] * 100:+7.1f} %" if a["value"] else "      —  "
        line = f"  {key:<42} {a['value']:10.2f} → {b['value']:10.2f} {b['unit']:<10} {change}"
        if b.get("ratio") is not None and a.get("ratio") is not None:
            line += f"   ratio {a['ratio']:.2f} → {b['ratio']:.2f}"
        if b.get("target"):
            line += f" (target {b['target']}{'' if b.get('met') is None else ': met' if b['met'] else ': NOT met'})"
        print(line)


def main(argv: list[str]) -> int:
    """Parse the arguments and run, compare, or both."""
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default: all of {BENCHES})")
    ap.add_argument("--out", type=Path, default=HERE / "results.json", help="where to write the figures")
    ap.add_argument("--compare", type=Path, metavar="OLD.json", help="after the run, compare with an earlier file")
    ap.add_argument("--diff", type=Path, nargs=2, metavar=("OLD.json", "NEW.json"), help="compare two files, no run")
    a = ap.parse_args(argv)
    if a.diff:
        diff(*a.diff)
        return 0
    unknown = set(a.names) - set(BENCHES)
    if unknown:
        print(f"unknown benchmark(s) {sorted(unknown)}; choose from {BENCHES}", file=sys.stderr)
        return 2
    old = a.compare.read_text() if a.compare else None  # read first: OLD may be the file this run overwrites
    status = run(a.names or BENCHES, a.out)
    if old is not None:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            f.write(old)
        diff(Path(f.name), a.out)
        os.unlink(f.name)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
