"""The sandboxed boundaries of a task child (README "Execution modes"): linux-dac (a root runner) and userns (a
runner that is not root).

Both start bubblewrap, which builds a root of nothing but: the system read-only (`/usr`, `/etc` with its secrets
masked, ...), the engine CLI's install roots and the runner's interpreter read-only, the run's workspace and the
principal's private home read-write, private `/proc`, `/dev` and `/tmp`, in new mount, PID, IPC and UTS namespaces.
linux-dac: inside, `setpriv` drops to the principal's uid with no capabilities and no_new_privs before the engine
starts. userns: bubblewrap also makes a new user namespace, so it needs no root; the child keeps the runner's uid
outside (no capabilities, no_new_privs, no nested user namespaces), and principals are kept apart by the mount
and PID namespaces alone. With `network = "isolated"` the child has its own network namespace: the in-namespace
init (`hub.runner.childinit`) forwards the hub's port and an egress proxy port on its loopback to sockets the
runner serves; nothing else of the runner's loopback is there.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..boxes import bwrap as bw
from ..domain.isolation import LINUX_DAC, NO_BWRAP, NOT_ROOT, ROOT_HAS_DAC, USERNS

BRIDGE_DIR = "/run/amux"      # where the runner's bridge sockets appear inside (isolated network)
PROXY_PORT = 3128             # the egress proxy's port on the child's loopback
TMP_BYTES = 1 << 30           # the child's private /tmp (memory-backed)
DEV_BYTES = 16 << 20          # the child's private /dev
# Run folders stay 0700 and owned by the child's uid; the folders above them are the runner's (root, 0700).
PRIVATE = 0o700
SYSCTL = Path("/proc/sys")   # read to name why user namespaces are unavailable (tests point it elsewhere)


@dataclass(frozen=True)
class Boundary:
    """What one sandboxed child may see and be."""

    uid: int | None                    # linux-dac: the principal's uid; None: userns (the runner's uid outside)
    workspace: Path
    home: Path
    reveal: tuple[Path, ...] = ()      # read-only, at their own paths: engine installs, the runner's interpreter
    hide: tuple[Path, ...] = ()        # masked wherever a revealed folder holds them (the hub's home, ...)
    network: str = "isolated"          # "isolated": own network namespace with bridges; "host": the runner's
    bridge: Path | None = None         # the run's bridge folder (hub.sock, proxy.sock), isolated network only
    hub_port: int | None = None        # the port the child's AMUX_HUB_URL names on its own loopback
    extra_env: dict[str, str] = field(default_factory=dict)

    def wrap(self, command: Sequence[str], env: Mapping[str, str],
             path_env: str | None = None) -> tuple[list[str], dict[str, str]]:
        """Return (argv, env) that run `command` inside this boundary. The executable is named by its real path
        (found on the child's PATH), so that the symlinks that led to it need not exist inside."""
        bwrap = shutil.which("bwrap")
        if not bwrap:
            raise OSError(NO_BWRAP)
        exe = command[0]
        found = exe if os.sep in exe else shutil.which(exe, path=path_env or env.get("PATH"))
        if not found:
            raise FileNotFoundError(f"{exe} is not on the runner's PATH")
        real = Path(found).resolve()
        reveal = (*self.reveal, *install_roots(real, path_env or env.get("PATH", os.defpath)))
        disable = self.uid is None and bwrap_takes(bwrap, "--disable-userns")
        return (argv(bwrap, replace(self, reveal=reveal), [str(real), *command[1:]], disable_userns=disable),
                child_env(self, env))


def inside_port(port: int, uid: int | None) -> int:
    """The port the hub's forward listens on in the child's loopback: the hub's own, except that a userns child's
    init has no capability to bind a port below 1024 (a hub on :80 is reached on :20080 there)."""
    return port + 20000 if uid is None and port < 1024 else port


def unavailable(mode: str = LINUX_DAC) -> str | None:
    """Say why this machine cannot provide `mode` (linux-dac or userns), or None when it can (a real sandbox is
    started once)."""
    if sys.platform != "linux":
        return f"{mode} needs Linux namespaces; this runner is not on Linux"
    root = os.geteuid() == 0
    if mode == LINUX_DAC and not root:
        return NOT_ROOT
    if mode == USERNS and root:
        return ROOT_HAS_DAC
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return NO_BWRAP
    if mode == LINUX_DAC and not shutil.which("setpriv"):
        return "`setpriv` is missing on the runner (`apt-get install util-linux`)"
    spaces = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent"]
    if mode == USERNS:
        spaces = ["--unshare-user", *spaces]
    argv = [bwrap, *spaces, *bw.system_binds([]), "--proc", "/proc", "--dev", "/dev", "--"]
    argv += (["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--no-new-privs", "--", "true"]
             if mode == LINUX_DAC else ["true"])
    try:
        probe = subprocess.run(argv, capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap could not start a sandbox on the runner ({e})"
    if probe.returncode != 0:
        detail = probe.stderr.decode(errors="replace").strip()[-300:] or f"exit status {probe.returncode}"
        if mode == USERNS:
            return f"bubblewrap could not make a user namespace on the runner ({detail}); {userns_fix()}"
        return f"bubblewrap could not start a sandbox on the runner ({detail})"
    return None


def _sysctl(name: str) -> str | None:
    try:
        return (SYSCTL / name.replace(".", "/")).read_text().strip()
    except OSError:
        return None


def userns_fix() -> str:
    """Name what keeps an ordinary user from making user namespaces here, and the fix."""
    if _sysctl("kernel.unprivileged_userns_clone") == "0":
        return ("the kernel forbids user namespaces to ordinary users: `sysctl -w kernel.unprivileged_userns_clone=1` "
                "(and the same line in /etc/sysctl.d/ to keep it)")
    if _sysctl("user.max_user_namespaces") == "0":
        return ("the kernel allows no user namespaces: `sysctl -w user.max_user_namespaces=15000` (and the same line "
                "in /etc/sysctl.d/ to keep it)")
    if _sysctl("kernel.apparmor_restrict_unprivileged_userns") == "1":
        return ("AppArmor forbids unprivileged user namespaces: allow bubblewrap with an AppArmor profile (Ubuntu "
                "ships /etc/apparmor.d/bwrap-userns-restrict) or `sysctl -w "
                "kernel.apparmor_restrict_unprivileged_userns=0`")
    return ("user namespaces are unavailable to this user: check `sysctl kernel.unprivileged_userns_clone "
            "user.max_user_namespaces` (both must allow them) and any AppArmor or seccomp rule; or run the runner "
            "as root for linux-dac")


@functools.lru_cache(maxsize=8)
def bwrap_takes(bwrap: str, flag: str) -> bool:
    """Say whether this bubblewrap knows `flag` (`--disable-userns` came in 0.8)."""
    try:
        out = subprocess.run([bwrap, "--help"], capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return flag.encode() in out.stdout + out.stderr


def _venv_of(path: Path) -> Path | None:
    for parent in path.parents:
        if (parent / "pyvenv.cfg").is_file():
            return parent
    return None


def _python_home(venv: Path) -> Path | None:
    """The installation a virtualenv's interpreter comes from (`home = …/bin` in pyvenv.cfg)."""
    try:
        for line in (venv / "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                return Path(value.strip()).resolve().parent
    except OSError:
        return None
    return None


def _node_package(path: Path) -> Path | None:
    """The package folder of a file inside `…/node_modules/[@scope/]name/…` (npm keeps a global package's
    dependencies inside it)."""
    parts = path.parts
    if "node_modules" not in parts:
        return None
    i = len(parts) - 1 - parts[::-1].index("node_modules")
    depth = i + (3 if i + 1 < len(parts) and parts[i + 1].startswith("@") else 2)
    return Path(*parts[:depth]) if depth <= len(parts) else None


def _visible(path: Path) -> bool:
    """Say whether the system binds already show `path`."""
    return any(path == Path(d) or Path(d) in path.parents for d in bw.SYSTEM_DIRS)


def _interpreter(script: Path, path_env: str) -> Path | None:
    """The interpreter a `#!` line names (`env NAME` looked up on `path_env`)."""
    try:
        with open(script, "rb") as f:
            head = f.readline(512)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].decode(errors="replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":
        names = [w for w in words[1:] if not w.startswith("-")]
        found = shutil.which(names[0], path=path_env) if names else None
        return Path(found) if found else None
    return Path(words[0])


def install_roots(executable: str | os.PathLike[str], path_env: str, home: Path | None = None) -> set[Path]:
    """Return the folders a CLI needs read-only to run, wherever it is installed: a virtualenv (and the Python it
    comes from), an npm package, a `prefix/bin` tree, else the folder of the file, and the same for its `#!`
    interpreter. The system's folders are visible anyway; a home folder itself is never revealed whole."""
    roots: set[Path] = set()
    home = (home or Path.home()).resolve()
    seen: set[Path] = set()
    todo = [Path(executable)]
    while todo:
        real = todo.pop().resolve()
        if real in seen or not real.exists():
            continue
        seen.add(real)
        root: Path | None
        if (venv := _venv_of(real)) is not None:
            roots.add(venv)
            root = _python_home(venv)
        elif (package := _node_package(real)) is not None:
            root = package
        elif real.parent.name == "bin" and real.parent.parent not in (home, home / ".local", Path("/")):
            root = real.parent.parent
        else:
            root = real.parent
        if root is not None and root != home and root != Path("/"):
            roots.add(root)
        if (interp := _interpreter(real, path_env)) is not None:
            todo.append(interp)
    return {r for r in roots if not _visible(r)}


def launch_chain(executable: str | os.PathLike[str], path_env: str) -> list[Path]:
    """Return the real file a CLI runs from and, after it, each `#!` interpreter it needs, in order."""
    out: list[Path] = []
    todo: Path | None = Path(executable)
    while todo is not None and len(out) < 8:
        real = todo.resolve()
        if real in out:
            break
        out.append(real)
        todo = _interpreter(real, path_env)
    return out


def cannot_launch(engine: str, executable: str, path_env: str, mode: str,
                  hide: tuple[Path, ...] = ()) -> str | None:
    """Say why a child in `mode` (linux-dac or userns) could not run `executable`, with its path and the fix, or
    None when it can. Probed once inside a sandbox built as a run's is: each file of its launch chain must be
    executable there, and a script readable too."""
    import tempfile

    bwrap = shutil.which("bwrap")
    found = executable if os.sep in executable else shutil.which(executable, path=path_env)
    if not bwrap or not found:
        return None  # said elsewhere (no bubblewrap; the engine is not available)
    chain = launch_chain(found, path_env)
    checks = [("rx:" if _is_script(f) else "x:") + str(f) for f in chain]
    uid = 65534 if mode == LINUX_DAC else None
    script = ('for c; do f=${c#*:}; [ -x "$f" ] || { echo "run:$f"; exit 1; }; '
              'case $c in rx:*) [ -r "$f" ] || { echo "read:$f"; exit 1; };; esac; done')
    with tempfile.TemporaryDirectory(prefix="amux-probe-") as tmp:
        work, home = Path(tmp, "w"), Path(tmp, "h")
        for folder in (work, home):
            prepare(folder, uid)
        b = Boundary(uid, work, home, tuple(install_roots(found, path_env)) + tuple(runner_roots()), hide,
                     network="host")
        disable = uid is None and bwrap_takes(bwrap, "--disable-userns")
        command = argv(bwrap, b, ["/bin/sh", "-c", script, "sh", *checks], disable_userns=disable)
        try:
            probe = subprocess.run(command, capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{engine} could not be checked inside a {mode} sandbox ({e})"
    if probe.returncode == 0:
        return None
    what, _, path = probe.stdout.decode(errors="replace").strip().partition(":")
    if not path:
        return (f"{engine} ({chain[0]}) could not be checked inside a {mode} sandbox "
                f"({probe.stderr.decode(errors='replace').strip()[-200:]})")
    verb = "read" if what == "read" else "executed"
    if mode == LINUX_DAC:
        return (f"{engine}: {path} cannot be {verb} by a linux-dac child, which runs under a uid of its own; install "
                f"the CLI where every user can read and run it (under /usr/local, or `chmod -R o+rX` its install "
                f"folder and `chmod o+x` the folders above it)")
    return (f"{engine}: {path} cannot be {verb} inside the userns sandbox, which binds only the system, the CLI's "
            f"install folder and the runner's interpreter; install the CLI and its interpreter under /usr/local or "
            f"a prefix of their own, outside the runner's workspaces and the hub's home")


def _is_script(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return True  # unreadable here: the probe inside says so


def runner_roots() -> set[Path]:
    """The runner's own interpreter and packages (the `amux` memory CLI and the scripted engine run on them)."""
    roots = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    for name in ("hub", "bot"):  # found, not imported: the runner only needs their folders
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:  # a namespace package has no file (these are regular packages)
            continue
        folder = Path(spec.origin).resolve().parent
        if not any(r in folder.parents for r in roots):
            roots.add(folder)
    return {r for r in roots if not _visible(r)}


def _ancestors(paths: Iterable[Path]) -> list[Path]:
    """Every folder above `paths`, shallowest first (bubblewrap would make them 0700; the child must pass)."""
    out: set[Path] = set()
    for p in paths:
        out.update(a for a in p.parents if a != Path("/"))
    return sorted(out, key=lambda a: (len(a.parts), str(a)))


DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def dev_argv() -> list[str]:
    """A sized /dev of the harmless devices only (bubblewrap's own `--dev` is an unsized tmpfs), with a sized
    /dev/shm and the usual links."""
    out = ["--size", str(DEV_BYTES), "--tmpfs", "/dev"]
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            out += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    out += ["--size", str(DEV_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm",
            "--symlink", "/proc/self/fd", "/dev/fd", "--symlink", "/proc/self/fd/0", "/dev/stdin",
            "--symlink", "/proc/self/fd/1", "/dev/stdout", "--symlink", "/proc/self/fd/2", "/dev/stderr"]
    return out


def argv(bwrap: str, b: Boundary, command: Sequence[str], *, disable_userns: bool = False) -> list[str]:
    """Return the bubblewrap command line that runs `command` inside `b` as its uid (pure). A userns boundary
    (`uid` None) adds a user namespace with every capability dropped and, where bubblewrap can
    (`disable_userns`), no nested user namespaces."""
    binds = sorted(set(b.reveal), key=lambda p: (len(p.parts), str(p)))
    rw = [b.workspace, b.home]
    out = [bwrap]
    if b.uid is None:
        out += ["--unshare-user", *(["--disable-userns"] if disable_userns else []), "--cap-drop", "ALL"]
    out += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
            "--new-session"]
    if b.network == "isolated":
        out.append("--unshare-net")
    out += bw.system_binds(list(b.hide))
    out += ["--proc", "/proc", *dev_argv(), "--size", str(TMP_BYTES), "--perms", "1777", "--tmpfs", "/tmp"]
    for folder in _ancestors([*binds, *rw]):
        if not _visible(folder) and folder not in binds and folder not in rw:
            out += ["--perms", "0755", "--dir", str(folder)]
    for folder in binds:
        out += ["--ro-bind", str(folder), str(folder)]
    for hidden in b.hide:  # a secret inside a revealed folder (bw.system_binds masks those in /etc)
        if any(r == hidden or r in hidden.parents for r in binds) and not _visible(hidden) and hidden.exists():
            out += (["--tmpfs", str(hidden), "--remount-ro", str(hidden)] if hidden.is_dir()
                    else ["--ro-bind", "/dev/null", str(hidden)])
    for folder in rw:
        out += ["--bind", str(folder), str(folder)]
    if b.bridge is not None:
        out += ["--ro-bind", str(b.bridge), BRIDGE_DIR]
    out += ["--remount-ro", "/", "--chdir", str(b.workspace), "--"]
    drop = [] if b.uid is None else [
        "setpriv", "--reuid", str(b.uid), "--regid", str(b.uid), "--clear-groups", "--bounding-set=-all",
        "--inh-caps=-all", "--no-new-privs", "--"]
    if b.network == "isolated" and b.bridge is not None:
        forward = ["--forward", f"{PROXY_PORT}={BRIDGE_DIR}/proxy.sock"]
        if b.hub_port is not None:
            forward += ["--forward", f"{b.hub_port}={BRIDGE_DIR}/hub.sock"]
        return [*out, sys.executable, "-I", str(Path(__file__).with_name("childinit.py")), *forward, "--", *drop,
                *command]
    return [*out, *drop, *command]


def child_env(b: Boundary, env: Mapping[str, str]) -> dict[str, str]:
    """Return the child's environment inside `b`: HOME is the principal's home; on an isolated network the hub is
    reached on the child's loopback and everything else through the egress proxy."""
    out = {**env, "HOME": str(b.home), **b.extra_env}
    if b.network == "isolated" and b.bridge is not None:
        proxy = f"http://127.0.0.1:{PROXY_PORT}"
        out.update({"HTTPS_PROXY": proxy, "https_proxy": proxy, "HTTP_PROXY": proxy, "http_proxy": proxy,
                    "ALL_PROXY": proxy, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"})
    return out


def prepare(folder: Path, uid: int | None) -> None:
    """Make `folder` (and its parents, the runner's) and give it to `uid` (None: the runner's own), 0700."""
    folder.parent.mkdir(mode=PRIVATE, parents=True, exist_ok=True)
    folder.mkdir(mode=PRIVATE, exist_ok=True)
    st = folder.stat()
    if uid is not None and (st.st_uid != uid or st.st_gid != uid):
        os.chown(folder, uid, uid)
    os.chmod(folder, PRIVATE)
