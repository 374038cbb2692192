"""The user's state folder: caches (the wheelhouse) and the local registry's data, outside the repo;
and this process as the owner of what a run leaves on a shared engine (its smoke containers)."""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path


def state_dir() -> Path:
    """Where builder keeps caches and the local registry's data (outside the repo)."""
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "ml-image-builder"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # not Linux: the PID alone
        return "-"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").removeprefix("pid:")
    except OSError:
        return "-"


def _started(pid: int) -> str | None:
    """When process *pid* started (clock ticks since boot; "-" where /proc is absent), None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        stat = ""
    if not stat:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "-"
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name before ")" may hold spaces


@functools.cache
def owner() -> str:
    """This process, as a label value: ``host/boot ID/PID namespace/PID/start time`` (a PID alone is
    reused, and means nothing on another host or in another PID namespace: a container's).

    Example:
        >>> owner().split("/")[3] == str(os.getpid())
        True
    """
    return f"{socket.gethostname()}/{_boot_id()}/{_pid_namespace()}/{os.getpid()}/{_started(os.getpid())}"


def owner_gone(token: str) -> bool:
    """Whether the process *token* (an :func:`owner`) is certainly gone: it ran on this host, which has
    rebooted since, or its PID (in this PID namespace) is free or now another process's. False for
    another host's or PID namespace's, or an unknown format (never touch what may be alive).

    Example:
        >>> owner_gone(owner()), owner_gone("another-host/x/y/1/1"), owner_gone("1")
        (False, False, False)
    """
    parts = token.split("/")
    if len(parts) != 5 or parts[0] != socket.gethostname() or not parts[3].isdigit():
        return False
    _, boot, namespace, pid, started = parts
    if boot != _boot_id():
        return True  # this host rebooted since: every process of that boot is gone
    return namespace == _pid_namespace() and _started(int(pid)) != started
