"""bench/mcp_calls: only the MCP per-call part — `profile_list`, lease-gated `rift_vm_list` and the bare echo, in
alternating rounds, one store at a time (a quick driver for work on these figures; bench/dispatch and bench/leases
print the figures of record).

Run: `.venv/bin/python -m bench.mcp_calls [--store sqlite|postgresql] [--rounds R] [--calls N] [--against DIR]
[--spy FILE]`. `--against DIR` also runs a hub from another checkout (say `git archive` of the previous commit) in
the same alternating rounds, on its own database, so a change is measured against its base under the same load.
On PostgreSQL a second bare echo that reads PostgreSQL once a call (`SELECT $1`) runs in the same rounds: the floor
of a call that reads the database. `--spy FILE` records this checkout's hub with py-spy (`--gil`, raw) during the
timed rounds (`--spy-echo`: the bare echo server instead); summarize it with
`python -m bench.topframes FILE --under profile_list`.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import AsyncIterator

import httpx2

from .common import ONE_ADDRESS, PG_URL, REPO, free_port, pct, pg_database
from .leases import _wait_http, bare_server, client, timed


@contextlib.asynccontextmanager
async def hub_at(repo: Path, store: str) -> AsyncIterator[tuple[str, str, int]]:
    """Run `amux hub serve` from checkout `repo` on a fresh database; yield (url, admin token, pid)."""
    ctx = pg_database() if store == "postgresql" else contextlib.nullcontext(None)
    async with ctx as db_url:
        home = Path(tempfile.mkdtemp(prefix="amux-bench-calls-"))
        port = free_port()
        db = db_url or f"sqlite+aiosqlite:///{home / 'amux.db'}"
        env = {**os.environ, "AMUX_HOME": str(home), "PYTHONPATH": str(repo), **ONE_ADDRESS}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hub.cli", "hub", "serve", "--listen", f"127.0.0.1:{port}", "--db", db, cwd=repo,
            # stderr to a file: a pipe nobody reads stalls the hub once its access log fills it
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=open(home / "hub.stderr", "wb"))  # noqa: SIM115
        try:
            url = f"http://127.0.0.1:{port}"

            async def ready(http: httpx2.AsyncClient) -> bool:
                return (await http.get(f"{url}/readyz")).status_code == 200 and (home / "admin.token").exists()

            await _wait_http(url, proc, ready)
            yield url, (home / "admin.token").read_text().strip(), proc.pid
        finally:
            proc.terminate()
            await proc.wait()


async def run(store: str, rounds: int, calls: int, against: str | None, spy: str | None,
              spy_echo: bool = False) -> None:
    """Time the calls in `rounds` alternating rounds of `calls` each; print p50/p99 and the ratios to the echo."""
    hubs = [("this", REPO)] + ([("base", Path(against).resolve())] if against else [])
    async with contextlib.AsyncExitStack() as stack:
        bare = await stack.enter_async_context(bare_server())
        b = await stack.enter_async_context(client(bare, None))
        calls_of = {"echo": (b, "echo", {"text": "hi"})}
        pid = 0
        pids: dict[str, int] = {"echo": await listener_pid(bare)}
        if store == "postgresql":  # the floor of a call that reads PostgreSQL once
            bare_pg = await stack.enter_async_context(bare_server(PG_URL))
            calls_of["echo reading PG"] = (await stack.enter_async_context(client(bare_pg, None)), "echo",
                                           {"text": "hi"})
            pids["echo reading PG"] = await listener_pid(bare_pg)
        for name, repo in hubs:
            url, token, p = await stack.enter_async_context(hub_at(repo, store))
            pid = pid or p
            pids[f"{name} profile_list"] = pids[f"{name} rift_vm_list"] = p
            c = await stack.enter_async_context(client(url, token))
            task = (await c.call_tool("rift_task_new", {"name": "bench"})).structured_content
            # Boxes outlive their hub (by design, across restarts): closing the task destroys this one. The
            # callback runs before the client and the hub entered above are left.
            stack.push_async_callback(c.call_tool, "rift_task_close", {"task": task["handle"]})
            await c.call_tool("rift_vm_new", {"task": task["handle"], "name": "b1"})
            calls_of[f"{name} profile_list"] = (c, "profile_list", {})
            calls_of[f"{name} rift_vm_list"] = (c, "rift_vm_list", {"task": task["handle"]})
        for conn, tool, a in calls_of.values():
            await timed(conn, tool, a, 100)
        proc = None
        if spy:
            proc = await asyncio.create_subprocess_exec(
                str(Path(sys.executable).with_name("py-spy")), "record", "--gil", "-f", "raw",
                "--rate", os.environ.get("SPY_RATE", "250"),
                "--pid", str(pids["echo"] if spy_echo else pid), "-o", spy,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            await asyncio.sleep(1.0)
        out: dict[str, list[float]] = {k: [] for k in calls_of}
        cpu: dict[str, list[float]] = {k: [] for k in calls_of}
        mine: dict[str, float] = {k: 0.0 for k in calls_of}  # this process's CPU: the client's share of a call
        keys = list(calls_of)
        for r in range(rounds):
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:  # rotated, so no call always follows another
                conn, tool, a = calls_of[key]
                before, own = cpu_s(pids.get(key)), time.process_time()
                out[key] += await timed(conn, tool, a, calls)
                cpu[key].append(cpu_s(pids.get(key)) - before)
                mine[key] += time.process_time() - own
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            await proc.wait()
    e50 = pct(out["echo"], 50)
    for key, ms in out.items():
        print(f"  {store:<10} {key:<18} p50 {pct(ms, 50):5.2f} ms  p99 {pct(ms, 99):6.2f} ms  "
              f"→ {pct(ms, 50) / e50:.2f}× echo  ({len(ms)} calls)"
              + (f"; server CPU {sum(cpu[key]) / len(ms) * 1e6:4.0f} µs a call" if key in pids else "")
              + f", client {mine[key] / len(ms) * 1e6:4.0f} µs", flush=True)


async def listener_pid(url: str) -> int:
    """Return the pid of the process listening on `url`'s port."""
    proc = await asyncio.create_subprocess_exec("ss", "-ltnpH", f"sport = :{url.rsplit(':', 1)[1]}",
                                                stdout=asyncio.subprocess.PIPE)
    return int((await proc.communicate())[0].decode().split("pid=", 1)[1].split(",", 1)[0])


def cpu_s(pid: int | None) -> float:
    """Return a process's user + system CPU seconds so far (0 for none)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--against", default=None, help="another checkout whose hub runs in the same rounds")
    ap.add_argument("--spy", default=None)
    ap.add_argument("--spy-echo", action="store_true", help="record the bare echo server instead of this hub")
    ns = ap.parse_args()
    asyncio.run(run(ns.store, ns.rounds, ns.calls, ns.against, ns.spy, ns.spy_echo))
