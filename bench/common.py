"""Benchmark plumbing: hub subprocesses, fresh databases, percentiles."""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import AsyncIterator

import httpx2
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

REPO = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("AMUX_TEST_DATABASE_URL") or "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


BASE_REF = "397eb4e"  # the build before the store moved to public SQLAlchemy APIs (issue 42's figures compare with it)


def checkout(ref: str) -> Path | None:
    """Return a directory holding git ref `ref` of this repository (`git archive`, kept under the temp dir between
    runs), or None when the ref is not in this clone. A directory given as `ref` is returned as it is."""
    if Path(ref).is_dir():
        return Path(ref).resolve()
    try:
        commit = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    out = Path(tempfile.gettempdir()) / f"amux-build-{commit[:12]}"
    if not (out / ".complete").exists():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
        (out / ".complete").touch()
    return out


def free_port() -> int:
    """Return a free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    """Return the q-th percentile (nearest rank)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


@contextlib.asynccontextmanager
async def pg_database() -> AsyncIterator[str]:
    """Create a throwaway PostgreSQL database and drop it afterwards."""
    name = f"amux_bench_{uuid.uuid4().hex[:8]}"
    admin = create_async_engine(PG_URL.replace("postgresql://", "postgresql+asyncpg://"), isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(PG_URL).set(drivername="postgresql+asyncpg", database=name)
    url = url.render_as_string(hide_password=False)
    try:
        yield url
    finally:
        async with admin.connect() as conn:
            await conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


PROFILE_ENV = "AMUX_BENCH_PROFILE"  # a directory: each hub process named `profile_as` is recorded there by py-spy
PROFILE_RATE_ENV = "AMUX_BENCH_PROFILE_RATE"  # py-spy's samples a second (100 unless set)
PROFILE_GIL_ENV = "AMUX_BENCH_PROFILE_GIL"  # set: record only the thread holding the GIL (where the CPU goes)


# Every bench client connects from 127.0.0.1: the per-client connection limits would count the whole load as one
# client, so the benches turn them off (the global limits stay).
ONE_ADDRESS = {"AMUX_HUB__MAX_PENDING_PER_CLIENT": "0", "AMUX_HUB__MAX_CONNECTIONS_PER_CLIENT": "0"}


@contextlib.asynccontextmanager
async def hub_process(db_url: str | None, *, slots: int = 8, with_runner: bool = True,
                      env: dict[str, str] | None = None, profile_as: str | None = None,
                      repo: Path = REPO) -> AsyncIterator[tuple[str, str]]:
    """Run `amux up` (hub + in-process runner) in a subprocess, from checkout `repo` (this one by default; another
    build's source tree runs on this virtualenv); yield (url, admin token).

    The hub's stderr goes to a file (a pipe nobody reads would stall a chatty hub). With AMUX_BENCH_PROFILE=DIR and
    `profile_as`, py-spy records the hub from readiness to the end into DIR/<profile_as>.txt (raw format; summarize
    it with `python -m bench.topframes`).
    """
    home = Path(tempfile.mkdtemp(prefix="amux-bench-"))
    port = free_port()
    args = ["up", "--slots", str(slots)] if with_runner else ["hub", "serve"]
    args += ["--listen", f"127.0.0.1:{port}"] + (["--db", db_url] if db_url else [])
    errors = open(home / "hub.stderr", "wb")  # noqa: SIM115 — closed below
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.cli", *args, cwd=repo, env={**os.environ, "AMUX_HOME": str(home), **ONE_ADDRESS,
                                                              "PYTHONPATH": str(repo), **(env or {})},
        stdout=asyncio.subprocess.DEVNULL, stderr=errors)
    url = f"http://127.0.0.1:{port}"
    spy = None
    try:
        deadline = time.monotonic() + 60
        async with httpx2.AsyncClient() as http:
            while True:
                try:
                    if (await http.get(f"{url}/readyz")).status_code == 200 and (home / "admin.token").exists():
                        break
                except httpx2.TransportError:
                    pass
                if time.monotonic() > deadline or proc.returncode is not None:
                    raise RuntimeError(f"hub did not start: {(home / 'hub.stderr').read_text()[-2000:]}")
                await asyncio.sleep(0.1)
            token = (home / "admin.token").read_text().strip()
            if with_runner:  # wait for the in-process runner to register
                auth = {"Authorization": f"Bearer {token}"}
                while not (await http.get(f"{url}/api/v1/runtimes", headers=auth)).json()["runtimes"]:
                    await asyncio.sleep(0.1)
        if os.environ.get(PROFILE_ENV) and profile_as:
            out = Path(os.environ[PROFILE_ENV]) / f"{profile_as}.txt"
            out.parent.mkdir(parents=True, exist_ok=True)
            spy = await asyncio.create_subprocess_exec(
                str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(proc.pid), "--format", "raw",
                "--rate", os.environ.get(PROFILE_RATE_ENV, "100"), "--output", str(out),
                *(["--gil"] if os.environ.get(PROFILE_GIL_ENV) else []),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            await asyncio.sleep(0.5)
        yield url, token
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
            await spy.wait()
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
        errors.close()


# ------------------------------------------------------------ figures: one printed line, one JSON record each

OUT_ENV = "AMUX_BENCH_OUT"  # `python -m bench` points this at a JSON-lines file and assembles bench/results.json


def _met(ratio: float, target: str) -> bool:
    """Check `ratio` against a target written `≥ X` or `≤ X`."""
    op, _, num = target.partition(" ")
    return ratio >= float(num) if op == "≥" else ratio <= float(num)


def figure(key: str, text: str, *, value: float, unit: str, ratio: float | None = None, target: str | None = None,
           floor: float | None = None, met: bool | None = None, **extra: object) -> None:
    """Print one figure's line (ending with its ratio and target) and record it for bench/results.json.

    `target` is `≥ X` or `≤ X` and applies to `ratio` (else pass `met`); `floor` is the peer measured in the same run.
    """
    if met is None and ratio is not None and target:
        met = _met(ratio, target)
    tail = f"  → {ratio:.2f}" if ratio is not None else ""
    if target:
        tail += f" (target {target}" + ("" if met is None else f": {'met' if met else 'NOT met'}") + ")"
    print(f"  {text}{tail}", flush=True)
    out = os.environ.get(OUT_ENV)
    if out:
        import json

        rec = {"key": key, "value": value, "unit": unit, "ratio": ratio, "target": target, "met": met,
               "floor": floor, "text": text, **extra}
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
