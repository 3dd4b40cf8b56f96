"""The bubblewrap command lines of a sandboxed box: its long-lived init, and entering it (pure, no I/O but stat)."""
from __future__ import annotations

import os
from pathlib import Path

BOX_HOME = "/box"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Read-only system directories a box sees (Flatpak binds /usr and the merged-usr links the same way).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# Inside /etc, what is secret on the host stays hidden (files become empty, directories empty).
ETC_SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
               "/etc/ssh", "/etc/ssl/private", "/etc/security/opasswd", "/etc/machine-id", "/etc/krb5.keytab",
               "/etc/amux")
# The device nodes of a box's /dev, bound from the host (what bwrap's own `--dev` binds, less the pseudo-terminals:
# bwrap mounts a private devpts only inside its unsized `--dev` tmpfs).
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = (("/proc/self/fd", "/dev/fd"), ("/proc/self/fd/0", "/dev/stdin"), ("/proc/self/fd/1", "/dev/stdout"),
             ("/proc/self/fd/2", "/dev/stderr"))
DEV_BYTES = 64 * 1024     # /dev holds only its nodes and links, and is read-only besides
MASK_BYTES = 4 * 1024     # an empty read-only tmpfs over a secret directory of /etc


def system_binds(hide: list[Path]) -> list[str]:
    """Bind the system directories read-only (links stay links) and mask the secrets in them."""
    argv: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    bound = [Path(d) for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    for secret in [*map(Path, ETC_SECRETS), *hide]:
        if not any(secret == b or b in secret.parents for b in bound) or not os.path.lexists(secret):
            continue
        if secret.is_dir() and not secret.is_symlink():
            argv += ["--size", str(MASK_BYTES), "--tmpfs", str(secret), "--remount-ro", str(secret)]
        elif not secret.is_symlink():
            argv += ["--ro-bind", "/dev/null", str(secret)]
    return argv


def dev_binds(shm_bytes: int) -> list[str]:
    """Mount a box's /dev: a small read-only tmpfs with the host's harmless device nodes, and a sized /dev/shm.

    bwrap's `--dev` takes no `--size` (bubblewrap 0.8: "--size must be followed by --tmpfs"), so its tmpfs would be
    as large as half the host's memory; this one is sized, and read-only besides (device nodes stay usable).
    """
    argv = ["--size", str(DEV_BYTES), "--tmpfs", "/dev"]
    for name in DEVICES:
        argv += ["--dev-bind-try", f"/dev/{name}", f"/dev/{name}"]
    for target, link in DEV_LINKS:
        argv += ["--symlink", target, link]
    return [*argv, "--size", str(shm_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]


def init_argv(bwrap: str, box_id: str, *, network: str, disk_bytes: int, shm_bytes: int, hide: list[Path],
              info_fd: int) -> list[str]:
    """Return the command that starts a box's long-lived init: every namespace, root inside, nothing of the hub.

    Like Flatpak: `--unshare-all` (user, pid, mount, ipc, uts, cgroup, net), a new session, private
    /proc, /dev and /tmp, the system read-only. Every tmpfs has a size: /box and /tmp `disk_bytes`, /dev/shm
    `shm_bytes`, /dev and the masks over secret directories a few KiB, and the root is read-only; nothing it wrote
    outlives it. No `--die-with-parent`: a box outlives a hub restart; its init (pid 1 of the box) is what
    `destroy` kills, and the kernel then kills every process inside.
    """
    argv = [bwrap, "--unshare-all", "--unshare-user"]
    if network == "host":
        argv.append("--share-net")
    argv += ["--uid", "0", "--gid", "0", "--hostname", box_id.replace("_", "-"), "--new-session",
             "--cap-drop", "ALL", "--disable-userns", "--clearenv",
             *system_binds(hide),
             "--proc", "/proc", *dev_binds(shm_bytes),
             "--size", str(disk_bytes), "--tmpfs", "/tmp",
             "--size", str(disk_bytes), "--tmpfs", BOX_HOME, "--chdir", BOX_HOME,
             "--remount-ro", "/",  # bwrap's own root tmpfs: nothing but /box, /tmp (and the private /dev) is writable
             "--setenv", "PATH", PATH, "--setenv", "HOME", BOX_HOME, "--setenv", "AMUX_BOX_ID", box_id,
             "--info-fd", str(info_fd),
             "--", "sleep", "infinity"]
    return argv


_DROP = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs", "--"]
_SPACES = ["--mount", "--pid", "--ipc", "--uts", "--net", "--cgroup", "--root", "--wd"]


def enter_argv(init_pid: int, command: str, *, as_owner: bool = False) -> list[str]:
    """Return the command that runs `sh -c command` inside a running box, as its root, without capabilities.

    A root hub enters the box's user namespace and the others at once: root may enter any namespace. A hub that
    is not root (`as_owner`) may enter only as the owner of the box's outer user namespace, which owns the box's
    other namespaces: bwrap's `--disable-userns` put the box's init in a nested one. So it enters the outer user
    namespace first (its descriptor on stdin, from `outer_userns`), then the mount, PID, IPC, UTS, network and
    cgroup namespaces, then the init's own (pid 1 inside) — keeping its uid, which both namespaces map to root —
    and the command gets /dev/null back as its stdin.
    """
    if not as_owner:
        return ["nsenter", "-t", str(init_pid), "--user", *_SPACES, "--", *_DROP, "/bin/sh", "-c", command]
    return ["nsenter", "--preserve-credentials", "--user=/proc/self/fd/0", "-t", str(init_pid), *_SPACES, "--",
            "nsenter", "--preserve-credentials", "-t", "1", "--user", "--",
            *_DROP, "/bin/sh", "-c", 'exec </dev/null; exec /bin/sh -c "$1"', "sh", command]
