"""bench/launch: what each execution mode adds to launching one short task's child.

Run: `.venv/bin/python -m bench.launch [--runs 40]`. Prints figures; asserts nothing (≈ 15 s).

Each mode launches the same child, `/bin/sh -c true`, the way the runner does (hub/runner/boundary.py's
`Boundary.wrap` on the run's boundary, with the isolated network's bridges and init for the sandboxed modes), and
times spawn → exit:
- process: the plain child (the floor);
- process in a run's cgroup (as root): the group made, the child placed in it before exec, the group removed;
- linux-dac: as root, bubblewrap + `setpriv` to a principal's uid (skipped when this is not root);
- userns: bubblewrap with a user namespace, as an ordinary user (when this is root, a worker runs as `nobody`).
Each sandboxed figure's ratio is against process mode measured in the same run; the line says the added p50.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import REPO, figure, pct

NOBODY = 65534
DAC_UID = 300000  # execution.uid_base: the first principal's uid


async def _launch_times(mode: str, runs: int, cgroup: bool = False) -> list[float]:
    """Launch the child `runs` times in `mode` (with `cgroup`: in a run's cgroup, made before and removed after
    each launch, as the runner does); return each launch in ms."""
    from hub.domain.limits import Limits
    from hub.engines.process import before_exec, sandboxed
    from hub.runner import boundary as b
    from hub.runner import confine
    from hub.runner.egress import Egress

    tmp = Path(tempfile.mkdtemp(prefix="amux-launch-"))
    tmp.chmod(0o755)
    egress: Egress | None = None
    try:
        box: b.Boundary | None = None
        if mode != "process":
            uid = DAC_UID if mode == "linux-dac" else None
            work, home = tmp / "ws" / "task", tmp / "homes" / "p"
            b.prepare(work, uid)
            b.prepare(home, uid)
            egress = Egress(Path(tempfile.mkdtemp(prefix="amux-b-")), ("127.0.0.1", 8787), ())
            await egress.start()
            box = b.Boundary(uid, work, home, tuple(b.runner_roots()), (), network="isolated", bridge=egress.folder,
                             hub_port=8787)
        times = []
        limits = Limits(1 << 30, 256, 1.0)
        how = confine.mechanism(limits) if cgroup else {}
        for i in range(runs):
            argv, env = sandboxed(box, ["/bin/sh", "-c", "true"], {"PATH": "/usr/bin:/bin"})
            t0 = time.perf_counter()
            cage = confine.start(f"bench-{os.getpid()}-{i}", limits, how, 60) if cgroup else None
            proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=tmp, stdin=subprocess.DEVNULL,
                                                        preexec_fn=before_exec(cage))
            if await proc.wait() != 0:
                raise SystemExit(f"{mode}: the child failed ({argv[:6]} …)")
            if cage is not None:
                confine.end(cage)
            times.append((time.perf_counter() - t0) * 1000)
        return times
    finally:
        if egress is not None:
            await egress.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _as_nobody(runs: int) -> list[float]:
    """Time userns launches in a worker running as `nobody` (the system's interpreter, this tree's packages)."""
    site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{site}", "HOME": "/tmp"}

    def drop() -> None:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    out = subprocess.run(["/usr/bin/python3", "-m", "bench.launch", "--worker", "userns", "--runs", str(runs)],
                         cwd=REPO, env=env, preexec_fn=drop, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"userns worker failed: {out.stderr[-2000:]}")
    return list(json.loads(out.stdout))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.launch")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(_launch_times(args.worker, args.runs))))
        return
    from hub.runner import boundary as b

    print(f"bench/launch: `/bin/sh -c true` as a task child, {args.runs} launches per mode")
    base = asyncio.run(_launch_times("process", args.runs))
    floor = pct(base, 50)
    figure("launch.process.p50", f"process mode: spawn → exit p50 {floor:.1f} ms, p90 {pct(base, 90):.1f} ms",
           value=round(floor, 2), unit="ms")
    if os.geteuid() == 0:
        caged = asyncio.run(_launch_times("process", args.runs, cgroup=True))
        p50 = pct(caged, 50)
        figure("launch.cgroup.p50", f"process mode in a run's cgroup (made, entered before exec, removed): p50 "
               f"{p50:.1f} ms, p90 {pct(caged, 90):.1f} ms (the cgroup adds {p50 - floor:.1f} ms)",
               value=round(p50, 2), unit="ms", ratio=p50 / floor if floor else None, floor=round(floor, 2),
               added_ms=round(p50 - floor, 2))
    for mode in ("linux-dac", "userns"):
        if mode == "userns" and os.geteuid() == 0 and b.unavailable("userns") is not None:
            times = _as_nobody(args.runs)  # root offers linux-dac instead: measure as an ordinary user would run
        elif (why := b.unavailable(mode)) is not None:
            print(f"  {mode}: not measured here ({why})")
            continue
        else:
            times = asyncio.run(_launch_times(mode, args.runs))
        p50 = pct(times, 50)
        figure(f"launch.{mode}.p50", f"{mode}: spawn → exit p50 {p50:.1f} ms, p90 {pct(times, 90):.1f} ms "
               f"(adds {p50 - floor:.1f} ms to process mode)", value=round(p50, 2), unit="ms",
               ratio=p50 / floor if floor else None, floor=round(floor, 2), added_ms=round(p50 - floor, 2))


if __name__ == "__main__":
    main()
