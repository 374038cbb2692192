"""Small file helpers: atomic writes so an error never leaves a half-written file, and a lock file
that processes sharing a store (the wheelhouse, dist/published.json) take turns on."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: fcntl locks are per process: threads of one ``builder build -j`` take turns on this first.
_THREADS: dict[str, threading.RLock] = {}
_THREADS_GUARD = threading.Lock()
#: The lock files this thread holds already: a nested ``locked`` on one of them is a no-op, where a
#: second flock on a new descriptor would wait for this very process forever.
_HELD = threading.local()


#: While another process holds a lock, *waiting* hears of it this often (seconds).
WAITING_EVERY_S = 10


def _take(handle: Any, mode: int, waiting: Callable[[int], object] | None) -> None:
    """flock *handle* in *mode*; while another process holds it, call *waiting* with the seconds waited
    (at once, then every :data:`WAITING_EVERY_S`), so a run that waits says why it is silent."""
    if waiting is None:
        fcntl.flock(handle, mode)
        return
    started, told = time.monotonic(), None
    while True:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            waited = time.monotonic() - started
            if told is None or waited - told >= WAITING_EVERY_S:
                waiting(int(waited))
                told = waited
            time.sleep(0.2)


@contextlib.contextmanager
def locked(path: Path, shared: bool = False, waiting: Callable[[int], object] | None = None) -> Iterator[None]:
    """Hold the lock file *path* (created if absent) for the ``with`` block: exclusive, or *shared*;
    *waiting* hears how long it has waited while another process holds it (:func:`_take`).

    The kernel drops the lock when the process dies (SIGKILL included), so a killed run never
    leaves a stale lock behind. Nested in one thread, the inner ``with`` holds what the outer one
    took (its mode included).

    Example:
        >>> with locked(Path("dist/published.json.lock")), locked(Path("dist/published.json.lock")):
        ...     pass
    """
    key = str(path)
    held: set[str] = _HELD.__dict__.setdefault("paths", set())
    if key in held:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with _THREADS_GUARD:
        guard = _THREADS.setdefault(key, threading.RLock())
    with guard, open(path, "a") as handle:
        _take(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, waiting)  # released when the file closes
        held.add(key)
        try:
            yield
        finally:
            held.discard(key)


#: The temporary file of an :func:`atomic_write` to ``NAME``: ``.NAME.<8 random characters>.tmp``.
_TEMPORARY = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write *text* to *path* through a temporary file in the same folder and a rename; the file gets
    *mode* (``0o600`` for a secret: the temporary file is mkstemp's, 0600, from the start).

    Example:
        >>> atomic_write(Path("images/cpu/Dockerfile"), "FROM scratch\\n")
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_stale_temporaries(*folders: Path, recursive: bool = False, age_s: float = 600) -> list[Path]:
    """Remove the temporary files of :func:`atomic_write` that a killed run left in *folders* (and
    below, if *recursive*): a write holds one for milliseconds, so one older than *age_s* is stale.

    Example:
        >>> remove_stale_temporaries(Path("images"), recursive=True)
        []
    """
    stale = []
    deadline = time.time() - age_s
    for folder in folders:
        for path in folder.rglob(".*.tmp") if recursive else folder.glob(".*.tmp"):
            with contextlib.suppress(OSError):
                if _TEMPORARY.fullmatch(path.name) and path.is_file() and path.stat().st_mtime < deadline:
                    path.unlink()
                    stale.append(path)
    return stale


def published_path(root: Path) -> Path:
    """``dist/published.json`` of the project at *root*: the digests ``builder build --push`` published.

    Example:
        >>> published_path(Path("/src/project"))
        PosixPath('/src/project/dist/published.json')
    """
    return root / "dist" / "published.json"
