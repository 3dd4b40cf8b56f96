#!/usr/bin/env python3
"""Print a PostgreSQL URL for the test suite; only the URL goes to stdout, diagnostics to stderr.

a. `AMUX_TEST_DATABASE_URL`, printed unchanged;
b. a server on 127.0.0.1:5432 with trust auth (users postgres, root, $USER; database `test`, created if missing);
c. a throwaway cluster (initdb + pg_ctl) run as an unprivileged user (`amuxpg` when we are root) on a free port in
   `$AMUX_PG_DIR`, else /tmp/amux-pg (root) or $TMPDIR/amux-pg-<uid>; a cluster left by an earlier call is reused.

    ensure_postgres.py [--throwaway] [--stop | --purge]

Runs with the project's venv (asyncpg probes the server).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import asyncpg

HOST, PORT, DB, SUPERUSER, PG_USER = "127.0.0.1", 5432, "test", "postgres", "amuxpg"


class Failure(Exception):
    """A step that cannot be done here; the message says what to do."""


def log(msg: str) -> None:
    """Say something on stderr."""
    print(f"ensure_postgres: {msg}", file=sys.stderr, flush=True)


def url(user: str, port: int) -> str:
    """The URL the suite uses."""
    return f"postgresql+asyncpg://{user}@{HOST}:{port}/{DB}"


def probe(user: str, port: int, db: str = DB, sql: str = "select 1") -> object:
    """Run one statement on the server; raise on any failure."""
    async def run() -> object:
        conn = await asyncpg.connect(host=HOST, port=port, user=user, database=db, timeout=5)
        try:
            return await conn.fetchval(sql)
        finally:
            await conn.close()
    return asyncio.run(run())


def existing_server() -> str | None:
    """The machine's own server, if it takes one of our users (creating database `test` when it can)."""
    users = list(dict.fromkeys([SUPERUSER, "root", pwd.getpwuid(os.geteuid()).pw_name]))
    errors = []
    for user in users:
        try:
            probe(user, PORT)
            log(f"using the server on {HOST}:{PORT} as {user!r}")
            return url(user, PORT)
        except Exception as e:  # noqa: BLE001 — every failure is a reason to try the next user
            errors.append(f"{user}: {type(e).__name__}: {e}")
            with contextlib.suppress(Exception):
                probe(user, PORT, "postgres", f'CREATE DATABASE "{DB}"')
                probe(user, PORT)
                log(f"created database {DB!r} on {HOST}:{PORT} as {user!r}")
                return url(user, PORT)
    log(f"no usable server on {HOST}:{PORT}: " + "; ".join(errors))
    return None


def find_pg_bindir() -> str | None:
    """The directory of initdb and pg_ctl: PATH first, then Debian's /usr/lib/postgresql/<major>/bin, newest."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return os.path.dirname(on_path)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return os.path.dirname(found[-1]) if found else None


class Runner:
    """Run PostgreSQL's programs as an unprivileged user (it refuses to run as root)."""

    def __init__(self) -> None:
        self.user = self._system_user() if os.geteuid() == 0 else None
        pw = pwd.getpwnam(self.user) if self.user else pwd.getpwuid(os.geteuid())
        self.uid, self.gid = pw.pw_uid, pw.pw_gid

    @staticmethod
    def _system_user() -> str:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(PG_USER).pw_name
        subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
                        PG_USER], capture_output=True, check=False)
        try:
            return pwd.getpwnam(PG_USER).pw_name
        except KeyError:
            raise Failure(f"cannot create the unprivileged user {PG_USER!r} PostgreSQL needs when run as "
                          "root") from None

    def run(self, cmd: list[str], cwd: str, timeout: float = 120) -> tuple[int, str]:
        """Run `cmd` as that user; output goes to a file, not a pipe a daemonized postmaster would hold open."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"LC_ALL": "C", "HOME": cwd}
        full = ["runuser", "-u", self.user, "--", *cmd] if self.user else cmd
        with tempfile.TemporaryFile("w+") as out:
            try:
                rc = subprocess.run(full, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                    env=env, timeout=timeout, check=False).returncode
            except subprocess.TimeoutExpired:
                rc = -1
            out.seek(0)
            return rc, out.read()


class Cluster:
    """A throwaway cluster in one directory: data, socket, log and the port it was started on."""

    def __init__(self, runner: Runner, bindir: str) -> None:
        self.runner, self.bindir = runner, bindir
        self.base = os.environ.get("AMUX_PG_DIR") or (
            "/tmp/amux-pg" if os.geteuid() == 0 else os.path.join(tempfile.gettempdir(), f"amux-pg-{os.geteuid()}"))
        self.data, self.sock = f"{self.base}/data", f"{self.base}/sock"
        self.logfile, self.portfile = f"{self.base}/postgres.log", f"{self.base}/data/amux_port"

    def bin(self, name: str) -> str:
        """Path of one of the server's programs."""
        return os.path.join(self.bindir, name)

    def prepare_dirs(self) -> None:
        """Create the directories, owned by the server's user, mode 0700."""
        for d in (self.base, self.sock):
            os.makedirs(d, mode=0o700, exist_ok=True)
            os.chown(d, self.runner.uid, self.runner.gid)
            os.chmod(d, 0o700)

    @contextlib.contextmanager
    def lock(self):  # noqa: ANN201
        """Serialize concurrent callers (two `make test` at once)."""
        fd = os.open(self.base + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def initdb(self) -> None:
        """Make a fresh cluster with trust auth."""
        shutil.rmtree(self.data, ignore_errors=True)
        rc, out = self.runner.run([self.bin("initdb"), "-D", self.data, "-A", "trust", "-U", SUPERUSER, "-E", "UTF8",
                                   "--locale=C", "--no-sync"], cwd=self.base)
        if rc != 0:
            raise Failure(f"initdb failed:\n{out.strip()}")

    def start(self) -> int:
        """Start the server on a free port (tuned for tests: no fsync) and record the port."""
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        opts = shlex.join(["-p", str(port), "-k", self.sock, "-c", f"listen_addresses={HOST}", "-c", "fsync=off",
                           "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=300"])
        rc, out = self.runner.run([self.bin("pg_ctl"), "-D", self.data, "-l", self.logfile, "-w", "-t", "60", "-o",
                                   opts,
                                   "start"], cwd=self.base)
        if rc != 0:
            raise Failure(f"pg_ctl start failed:\n{out.strip()}")
        with open(self.portfile, "w") as f:
            f.write(f"{port}\n")
        return port

    def stop(self) -> bool:
        """Stop the server if it runs; say whether it did."""
        if self.runner.run([self.bin("pg_ctl"), "-D", self.data, "status"], cwd=self.base)[0] != 0:
            return False
        rc, out = self.runner.run([self.bin("pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop"], cwd=self.base)
        if rc != 0:
            raise Failure(f"pg_ctl stop failed:\n{out.strip()}")
        return True

    def ensure_database(self, port: int) -> None:
        """Create database `test` once the server accepts connections."""
        deadline = time.monotonic() + 30
        while True:
            try:
                exists = probe(SUPERUSER, port, "postgres", f"select 1 from pg_database where datname = '{DB}'")
                break
            except Exception:  # noqa: BLE001 — starting up
                if time.monotonic() > deadline:
                    raise Failure(f"the throwaway server on port {port} never accepted connections") from None
                time.sleep(0.3)
        if not exists:
            probe(SUPERUSER, port, "postgres", f'CREATE DATABASE "{DB}"')

    def ensure(self) -> str:
        """Reuse the cluster an earlier call left running, else make and start one."""
        self.prepare_dirs()
        with contextlib.suppress(OSError, ValueError, Exception):
            with open(self.portfile) as f:
                port = int(f.read())
            probe(SUPERUSER, port)
            log(f"reusing the throwaway cluster in {self.data} on port {port}")
            return url(SUPERUSER, port)
        with contextlib.suppress(Failure):
            self.stop()
        self.initdb()
        port = self.start()
        self.ensure_database(port)
        log(f"started a throwaway cluster in {self.data} on port {port}")
        return url(SUPERUSER, port)


def throwaway() -> str:
    """A URL on a throwaway cluster (installs Debian's postgresql when root and the binaries are missing)."""
    bindir = find_pg_bindir()
    if not bindir and os.geteuid() == 0 and shutil.which("apt-get"):
        log("installing postgresql (apt-get) ...")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run("apt-get install -y -q postgresql || (apt-get update -q && apt-get install -y -q postgresql)",
                       shell=True, env=env, capture_output=True, check=False)
        bindir = find_pg_bindir()
    if not bindir:
        raise Failure("no initdb/pg_ctl here; install PostgreSQL or set AMUX_TEST_DATABASE_URL")
    cluster = Cluster(Runner(), bindir)
    os.makedirs(os.path.dirname(cluster.base), exist_ok=True)
    with cluster.lock():
        return cluster.ensure()


def main(argv: list[str] | None = None) -> int:
    """Print the URL (or stop / purge the throwaway cluster)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--throwaway", action="store_true", help="skip a and b")
    ap.add_argument("--stop", action="store_true", help="stop the throwaway cluster")
    ap.add_argument("--purge", action="store_true", help="stop it and delete its directory")
    args = ap.parse_args(argv)
    try:
        if args.stop or args.purge:
            bindir = find_pg_bindir()
            if bindir:
                cluster = Cluster(Runner(), bindir)
                if os.path.isdir(cluster.data):
                    log("stopped" if cluster.stop() else "not running")
                if args.purge:
                    shutil.rmtree(cluster.base, ignore_errors=True)
            return 0
        force = args.throwaway or os.environ.get("AMUX_PG_THROWAWAY", "") not in ("", "0")
        found = None if force else (os.environ.get("AMUX_TEST_DATABASE_URL", "").strip() or existing_server())
        print(found or throwaway())
        return 0
    except Failure as e:
        log(f"ERROR: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
