#!/usr/bin/env python3
"""Print a PostgreSQL URL usable by the test suite (stdlib only).

Order of preference:

a. ``AMUX_TEST_DATABASE_URL`` from the environment, printed unchanged.
b. A server already listening on 127.0.0.1:5432 with trust auth and a
   database ``test`` (users tried: postgres, root, the current OS user).
c. A throwaway cluster started by this script (initdb + pg_ctl), run as an
   unprivileged user (``amuxpg`` when we are root), on a free port, in
   ``/tmp/amux-pg`` (root) or ``$TMPDIR/amux-pg-<uid>`` (others), or in
   ``$AMUX_PG_DIR`` if set. A cluster left running by an earlier call is reused.

Only the URL goes to stdout; every diagnostic goes to stderr.

    ensure_postgres.py            # print the URL
    ensure_postgres.py --stop     # stop the throwaway cluster (if running)
    ensure_postgres.py --purge    # stop it and delete its directory

``--throwaway`` (or ``AMUX_PG_THROWAWAY=1``) skips a and b and forces c.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import os
import pwd
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5432
DB_NAME = "test"
SUPERUSER = "postgres"
PG_SYSTEM_USER = "amuxpg"
URL_TEMPLATE = "postgresql+asyncpg://{user}@{host}:{port}/{db}"


class Failure(Exception):
    pass


def log(msg: str) -> None:
    print(f"ensure_postgres: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# probing a server
# --------------------------------------------------------------------------


def tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise Failure("server closed the connection")
        buf += chunk
    return buf


def _read_message(sock: socket.socket) -> tuple[bytes, bytes]:
    head = _recv_exact(sock, 5)
    kind, length = head[:1], struct.unpack("!I", head[1:])[0]
    return kind, _recv_exact(sock, length - 4)


def _error_text(body: bytes) -> str:
    fields = {}
    for part in body.split(b"\0"):
        if part:
            fields[part[:1]] = part[1:].decode("utf-8", "replace")
    return fields.get(b"M", "unknown error")


def wire_query(host: str, port: int, user: str, db: str, sql: str,
               timeout: float = 5.0) -> list[list[str | None]]:
    """Run one simple query over the v3 wire protocol (trust auth only)."""
    params = b"".join(
        k.encode() + b"\0" + v.encode() + b"\0"
        for k, v in (("user", user), ("database", db), ("client_encoding", "UTF8"))
    ) + b"\0"
    startup = struct.pack("!II", 8 + len(params), 196608) + params
    rows: list[list[str | None]] = []
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(startup)
        while True:
            kind, body = _read_message(sock)
            if kind == b"R":
                code = struct.unpack("!I", body[:4])[0]
                if code != 0:
                    raise Failure(f"server wants authentication (method {code}); only trust is supported")
            elif kind == b"E":
                raise Failure(_error_text(body))
            elif kind == b"Z":
                break
        payload = sql.encode() + b"\0"
        sock.sendall(b"Q" + struct.pack("!I", 4 + len(payload)) + payload)
        error = None
        while True:
            kind, body = _read_message(sock)
            if kind == b"D":
                ncol = struct.unpack("!H", body[:2])[0]
                pos, row = 2, []
                for _ in range(ncol):
                    (ln,) = struct.unpack("!i", body[pos:pos + 4])
                    pos += 4
                    if ln < 0:
                        row.append(None)
                    else:
                        row.append(body[pos:pos + ln].decode("utf-8", "replace"))
                        pos += ln
                rows.append(row)
            elif kind == b"E":
                error = _error_text(body)
            elif kind == b"Z":
                break
        with contextlib.suppress(OSError):
            sock.sendall(b"X" + struct.pack("!I", 4))
    if error:
        raise Failure(error)
    return rows


def run_sql(host: str, port: int, user: str, db: str, sql: str,
            psql: str | None = None) -> list[str]:
    """Run sql; return first-column values. Uses psql when given, else the wire protocol."""
    if psql:
        env = dict(os.environ, PGCONNECT_TIMEOUT="5")
        try:
            proc = subprocess.run(
                [psql, "-X", "-w", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1",
                 "-h", host, "-p", str(port), "-U", user, "-d", db, "-c", sql],
                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=20, env=env, cwd="/",
            )
        except subprocess.TimeoutExpired:
            raise Failure("psql timed out") from None
        if proc.returncode != 0:
            raise Failure((proc.stderr or proc.stdout).strip() or f"psql exited {proc.returncode}")
        return [line for line in proc.stdout.splitlines() if line != ""]
    return [row[0] or "" for row in wire_query(host, port, user, db, sql)]


def find_psql(bindir: str | None = None) -> str | None:
    if bindir and os.access(os.path.join(bindir, "psql"), os.X_OK):
        return os.path.join(bindir, "psql")
    return shutil.which("psql")


def candidate_users() -> list[str]:
    users = [SUPERUSER, "root"]
    with contextlib.suppress(Exception):
        users.append(pwd.getpwuid(os.geteuid()).pw_name)
    return list(dict.fromkeys(users))


def make_url(user: str, port: int, host: str = DEFAULT_HOST) -> str:
    return URL_TEMPLATE.format(user=user, host=host, port=port, db=DB_NAME)


# --------------------------------------------------------------------------
# path b: an existing server on 127.0.0.1:5432
# --------------------------------------------------------------------------


def try_existing_server() -> str | None:
    host, port = DEFAULT_HOST, DEFAULT_PORT
    if not tcp_open(host, port):
        log(f"nothing accepts connections on {host}:{port}")
        return None
    psql = find_psql()
    how = "psql" if psql else "built-in wire probe (psql not found)"
    errors = []
    for user in candidate_users():
        try:
            run_sql(host, port, user, DB_NAME, "select 1", psql)
        except Failure as exc:
            errors.append(f"  user {user!r}, db {DB_NAME!r}: {exc}")
            continue
        log(f"using existing server on {host}:{port} as user {user!r} (checked with {how})")
        return make_url(user, port, host)
    # The server works but has no database "test": create it if we can.
    for user in candidate_users():
        try:
            run_sql(host, port, user, "postgres", "select 1", psql)
        except Failure:
            continue
        try:
            run_sql(host, port, user, "postgres", f'CREATE DATABASE "{DB_NAME}"', psql)
            run_sql(host, port, user, DB_NAME, "select 1", psql)
        except Failure as exc:
            errors.append(f"  user {user!r}: creating database {DB_NAME!r} failed: {exc}")
            continue
        log(f"created database {DB_NAME!r} on existing server {host}:{port} as user {user!r}")
        return make_url(user, port, host)
    log(f"server on {host}:{port} is not usable:\n" + "\n".join(errors))
    return None


# --------------------------------------------------------------------------
# path c: a throwaway cluster
# --------------------------------------------------------------------------


def _version_key(path: str) -> tuple:
    name = os.path.basename(os.path.dirname(path.rstrip("/")))
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.]", name))


def find_pg_bindir() -> str | None:
    """Directory holding initdb, pg_ctl and postgres."""
    def complete(d: str) -> bool:
        return all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres"))

    initdb = shutil.which("initdb")
    if initdb:
        d = os.path.dirname(os.path.realpath(initdb))
        if complete(d):
            return d
    bindirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/"), key=_version_key, reverse=True)
    for d in bindirs:
        if complete(d):
            return d.rstrip("/")
    return None


def is_root() -> bool:
    return os.geteuid() == 0


def apt_install(*packages: str) -> bool:
    if not (is_root() and shutil.which("apt-get")):
        return False
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with tempfile.TemporaryFile("w+") as out:
        for attempt in ("install", "update+install"):
            if attempt == "update+install":
                subprocess.run(["apt-get", "update", "-q"], stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=env)
            log(f"apt-get install -y {' '.join(packages)} ({attempt}) ...")
            proc = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            if proc.returncode == 0:
                return True
        out.seek(0)
        tail = out.read()[-2000:]
    log(f"apt-get failed:\n{tail}")
    return False


class Runner:
    """Runs PostgreSQL server programs as an unprivileged user."""

    def __init__(self) -> None:
        if is_root():
            self.user = self._ensure_system_user()
            pw = pwd.getpwnam(self.user)
            self.uid, self.gid = pw.pw_uid, pw.pw_gid
        else:
            self.user = None
            self.uid, self.gid = os.geteuid(), os.getegid()

    @staticmethod
    def _ensure_system_user() -> str:
        try:
            pwd.getpwnam(PG_SYSTEM_USER)
            return PG_SYSTEM_USER
        except KeyError:
            pass
        nologin = next((p for p in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false") if os.path.exists(p)),
                       "/bin/false")
        attempts = [
            ["useradd", "--system", "--no-create-home", "--user-group",
             "--home-dir", "/nonexistent", "--shell", nologin, PG_SYSTEM_USER],
            ["adduser", "--system", "--group", "--no-create-home", PG_SYSTEM_USER],
            ["adduser", "-S", "-D", "-H", PG_SYSTEM_USER],  # busybox
        ]
        for cmd in attempts:
            if not shutil.which(cmd[0]):
                continue
            proc = subprocess.run(cmd, capture_output=True, text=True)
            with contextlib.suppress(KeyError):
                pwd.getpwnam(PG_SYSTEM_USER)
                log(f"created system user {PG_SYSTEM_USER!r}")
                return PG_SYSTEM_USER
            log(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
        raise Failure(f"cannot create the unprivileged user {PG_SYSTEM_USER!r} needed to run PostgreSQL as root")

    def run(self, cmd: list[str], cwd: str, timeout: float = 120) -> tuple[int, str]:
        """Run cmd as the PostgreSQL user; return (returncode, combined output).

        Output goes to a temp file, never a pipe, so a daemonised postmaster can't
        hold our pipes open.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C", HOME=cwd)
        if self.user is None:
            full, kwargs = cmd, {}
        elif shutil.which("runuser"):
            full, kwargs = ["runuser", "-u", self.user, "--", *cmd], {}
        elif shutil.which("su"):
            full, kwargs = ["su", self.user, "-s", "/bin/sh", "-c", shlex.join(cmd)], {}
        else:
            full, kwargs = cmd, {"user": self.uid, "group": self.gid, "extra_groups": []}
        with tempfile.TemporaryFile("w+") as out:
            try:
                proc = subprocess.run(full, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                      cwd=cwd, env=env, timeout=timeout, **kwargs)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = -1
            out.seek(0)
            text = out.read()
        if rc == -1:
            text += f"\n(timed out after {timeout}s)"
        return rc, text


def base_dir() -> str:
    if os.environ.get("AMUX_PG_DIR"):
        return os.path.abspath(os.environ["AMUX_PG_DIR"])
    if is_root():
        # /tmp rather than $TMPDIR: the unprivileged user must be able to reach it.
        return "/tmp/amux-pg"
    return os.path.join(tempfile.gettempdir(), f"amux-pg-{os.geteuid()}")


class Cluster:
    def __init__(self, runner: Runner, bindir: str | None) -> None:
        self.runner = runner
        self.bindir = bindir
        self.base = base_dir()
        self.data = os.path.join(self.base, "data")
        self.sock = os.path.join(self.base, "sock")
        self.logfile = os.path.join(self.base, "postgres.log")
        self.portfile = os.path.join(self.data, "amux_port")

    def bin(self, name: str) -> str:
        assert self.bindir
        return os.path.join(self.bindir, name)

    # -- filesystem ------------------------------------------------------
    def prepare_dirs(self) -> None:
        os.makedirs(self.base, mode=0o700, exist_ok=True)
        for d in (self.base, self.sock):
            os.makedirs(d, mode=0o700, exist_ok=True)
            st = os.stat(d)
            if (st.st_uid, st.st_gid) != (self.runner.uid, self.runner.gid):
                if is_root():
                    for root, dirs, files in os.walk(d):
                        for name in [root] + [os.path.join(root, n) for n in dirs + files]:
                            with contextlib.suppress(OSError):
                                os.lchown(name, self.runner.uid, self.runner.gid)
                else:
                    raise Failure(f"{d} is owned by uid {st.st_uid}, not us; set AMUX_PG_DIR elsewhere")
            os.chmod(d, 0o700)

    @contextlib.contextmanager
    def lock(self):
        os.makedirs(os.path.dirname(self.base) or "/", exist_ok=True)
        path = self.base + ".lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def recorded_port(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            with open(self.portfile) as f:
                return int(f.read().strip())
        return None

    # -- server control --------------------------------------------------
    def status_running(self) -> bool:
        if not self.bindir or not os.path.isfile(os.path.join(self.data, "PG_VERSION")):
            return False
        rc, _ = self.runner.run([self.bin("pg_ctl"), "-D", self.data, "status"], cwd=self.base)
        return rc == 0

    def usable(self, port: int) -> bool:
        try:
            run_sql(DEFAULT_HOST, port, SUPERUSER, DB_NAME, "select 1", find_psql(self.bindir))
            return True
        except (Failure, OSError):
            return False

    def binaries_major(self) -> str:
        rc, out = self.runner.run([self.bin("initdb"), "--version"], cwd=self.base)
        m = re.search(r"(\d+)(?:\.\d+)?", out)
        return m.group(1) if m else ""

    def initdb(self) -> None:
        if os.path.exists(self.data):
            shutil.rmtree(self.data)
        log(f"initdb {self.data} ({self.bindir})")
        rc, out = self.runner.run(
            [self.bin("initdb"), "-D", self.data, "-A", "trust", "-U", SUPERUSER,
             "-E", "UTF8", "--locale=C", "--no-sync"],
            cwd=self.base,
        )
        if rc != 0:
            raise Failure(f"initdb failed:\n{out.strip()}")

    def start(self) -> int:
        port = free_port()
        opts = " ".join(shlex.quote(o) for o in (
            "-p", str(port), "-k", self.sock,
            "-c", f"listen_addresses={DEFAULT_HOST}",
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            "-c", "max_connections=200",
        ))
        log(f"starting throwaway PostgreSQL on {DEFAULT_HOST}:{port}")
        rc, out = self.runner.run(
            [self.bin("pg_ctl"), "-D", self.data, "-l", self.logfile, "-w", "-t", "60", "-o", opts, "start"],
            cwd=self.base,
        )
        if rc != 0:
            raise Failure(f"pg_ctl start failed:\n{out.strip()}\n--- {self.logfile} (tail) ---\n{tail(self.logfile)}")
        with open(self.portfile, "w") as f:
            f.write(f"{port}\n")
        with contextlib.suppress(OSError):
            os.chown(self.portfile, self.runner.uid, self.runner.gid)
        return port

    def stop(self) -> bool:
        if not self.status_running():
            return False
        rc, out = self.runner.run([self.bin("pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop"], cwd=self.base)
        if rc != 0:
            raise Failure(f"pg_ctl stop failed:\n{out.strip()}")
        return True

    def ensure_database(self, port: int) -> None:
        psql = find_psql(self.bindir)
        deadline = time.monotonic() + 30
        while True:
            try:
                rows = run_sql(DEFAULT_HOST, port, SUPERUSER, "postgres",
                               f"select 1 from pg_database where datname = '{DB_NAME}'", psql)
                break
            except Failure as exc:
                if time.monotonic() > deadline:
                    raise Failure(f"cannot connect to throwaway server on port {port}: {exc}") from None
                time.sleep(0.3)
        if not rows:
            log(f"creating database {DB_NAME!r}")
            run_sql(DEFAULT_HOST, port, SUPERUSER, "postgres", f'CREATE DATABASE "{DB_NAME}"', psql)

    # -- orchestration ---------------------------------------------------
    def ensure(self) -> str:
        self.prepare_dirs()
        port = self.recorded_port()
        if port and self.status_running():
            if self.usable(port):
                log(f"reusing throwaway PostgreSQL in {self.data} on port {port}")
                return make_url(SUPERUSER, port)
            log("throwaway cluster runs but is not usable; restarting it")
            with contextlib.suppress(Failure):
                self.stop()

        fresh = False
        pg_version = os.path.join(self.data, "PG_VERSION")
        if os.path.isfile(pg_version):
            with open(pg_version) as f:
                have = f.read().strip()
            want = self.binaries_major()
            if want and have != want:
                log(f"existing cluster is version {have}, binaries are {want}: re-initialising")
                self.initdb()
                fresh = True
        else:
            self.initdb()
            fresh = True

        try:
            port = self.start()
        except Failure as exc:
            if fresh:
                raise
            log(f"{exc}\nre-initialising the throwaway cluster and retrying")
            self.initdb()
            port = self.start()
        self.ensure_database(port)
        return make_url(SUPERUSER, port)


def tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError as exc:
        return f"({exc})"


def free_port() -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((DEFAULT_HOST, 0))
            port = s.getsockname()[1]
        if port != DEFAULT_PORT:
            return port
    raise Failure("could not find a free TCP port")


def throwaway_url() -> str:
    bindir = find_pg_bindir()
    if not bindir:
        log("initdb/pg_ctl not found on PATH or in /usr/lib/postgresql/*/bin")
        if apt_install("postgresql"):
            bindir = find_pg_bindir()
    if not bindir:
        raise Failure(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) available and they could not be "
            "installed; install PostgreSQL or set AMUX_TEST_DATABASE_URL"
        )
    cluster = Cluster(Runner(), bindir)
    with cluster.lock():
        return cluster.ensure()


def stop_throwaway(purge: bool) -> None:
    bindir = find_pg_bindir()
    runner = Runner() if (not is_root() or _user_exists(PG_SYSTEM_USER)) else None
    base = base_dir()
    if runner is None:
        log(f"no {PG_SYSTEM_USER!r} user, so no throwaway cluster was started by this script")
    else:
        cluster = Cluster(runner, bindir)
        if not os.path.isdir(cluster.base):
            log(f"no throwaway cluster in {cluster.base}")
            return
        with cluster.lock():
            if bindir and cluster.stop():
                log(f"stopped throwaway PostgreSQL in {cluster.data}")
            else:
                log(f"throwaway PostgreSQL in {cluster.data} is not running")
    if purge and os.path.isdir(base):
        shutil.rmtree(base)
        with contextlib.suppress(OSError):
            os.unlink(base + ".lock")
        log(f"removed {base}")


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Print a PostgreSQL URL for the amux test suite.")
    ap.add_argument("--stop", action="store_true", help="stop the throwaway cluster started by this script")
    ap.add_argument("--purge", action="store_true", help="stop the throwaway cluster and delete its files")
    ap.add_argument("--throwaway", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    try:
        if args.stop or args.purge:
            stop_throwaway(purge=args.purge)
            return 0

        force = args.throwaway or os.environ.get("AMUX_PG_THROWAWAY", "") not in ("", "0")
        if not force:
            url = os.environ.get("AMUX_TEST_DATABASE_URL", "").strip()
            if url:
                print(url)
                return 0
            url = try_existing_server()
            if url:
                print(url)
                return 0
            log("falling back to a throwaway cluster")
        print(throwaway_url())
        return 0
    except Failure as exc:
        log(f"ERROR: {exc}")
        log("no PostgreSQL available; set AMUX_TEST_DATABASE_URL to a reachable server to skip this step")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
