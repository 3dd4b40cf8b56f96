"""Run every benchmark in turn: `.venv/bin/python -m bench [NAME ...]` (or `make bench`)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHES = [p.stem for p in sorted(Path(__file__).parent.glob("*.py"))
           if p.stem not in ("__init__", "__main__", "common", "bare_mcp")]


def main(names: list[str]) -> int:
    """Run the named benchmarks (all by default), each in its own interpreter."""
    chosen = names or BENCHES
    unknown = set(chosen) - set(BENCHES)
    if unknown:
        print(f"unknown benchmark(s) {sorted(unknown)}; choose from {BENCHES}", file=sys.stderr)
        return 2
    status = 0
    for name in chosen:
        status |= subprocess.call([sys.executable, "-m", f"bench.{name}"], cwd=Path(__file__).parent.parent)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
