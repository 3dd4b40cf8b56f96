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
            argv += ["--tmpfs", str(secret), "--remount-ro", str(secret)]
        elif not secret.is_symlink():
            argv += ["--ro-bind", "/dev/null", str(secret)]
    return argv


def init_argv(bwrap: str, box_id: str, *, network: str, disk_bytes: int, hide: list[Path], info_fd: int) -> list[str]:
    """Return the command that starts a box's long-lived init: every namespace, root inside, nothing of the hub.

    Like Flatpak: `--unshare-all` (user, pid, mount, ipc, uts, cgroup, net), a new session, private
    /proc, /dev and /tmp, the system read-only. The box's writable filesystem is a size-capped tmpfs
    at /box, so nothing it wrote outlives it. No `--die-with-parent`: a box outlives a hub restart; its
    init (pid 1 of the box) is what `destroy` kills, and the kernel then kills every process inside.
    """
    argv = [bwrap, "--unshare-all", "--unshare-user"]
    if network == "host":
        argv.append("--share-net")
    argv += ["--uid", "0", "--gid", "0", "--hostname", box_id.replace("_", "-"), "--new-session",
             "--cap-drop", "ALL", "--disable-userns", "--clearenv",
             *system_binds(hide),
             "--proc", "/proc", "--dev", "/dev",
             "--size", str(disk_bytes), "--tmpfs", "/tmp",
             "--size", str(disk_bytes), "--tmpfs", BOX_HOME, "--chdir", BOX_HOME,
             "--remount-ro", "/",  # bwrap's own root tmpfs: nothing but /box, /tmp (and the private /dev) is writable
             "--setenv", "PATH", PATH, "--setenv", "HOME", BOX_HOME, "--setenv", "AMUX_BOX_ID", box_id,
             "--info-fd", str(info_fd),
             "--", "sleep", "infinity"]
    return argv


def enter_argv(init_pid: int, command: str) -> list[str]:
    """Return the command that runs `sh -c command` inside a running box, as its root, without capabilities."""
    return ["nsenter", "-t", str(init_pid), "--user", "--mount", "--pid", "--ipc", "--uts", "--net", "--cgroup",
            "--root", "--wd", "--",
            "setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs", "--",
            "/bin/sh", "-c", command]
