"""What this builder owns on a shared host, by records it writes itself: never by a name, a pattern or an age.

Two parts, used by every store the builder cleans (the wheelhouse, staged folders, images, smoke
containers, the loopback registry):

- **Runs.** Each builder process holds a *run lease* for its lifetime: an exclusive ``flock`` on a
  file of its own under ``<state>/runs/`` (:func:`run_token`). The kernel drops it when the process
  dies, SIGKILL included, so whether a run is alive is a question the lock answers
  (:func:`run_state`), not ``/proc`` (``hidepid`` hides other users' processes) nor a hostname (two
  hosts may share one name and one remote engine). A token names the machine and the lock file;
  a token of another machine, or a lock file this process cannot read (another user's), is
  ``"unknown"``: never touched.
- **Ledgers.** A :class:`Ledger` is a JSON file of records, one per thing the builder made or
  fetched (a wheel, an image, a staged folder...): when it was recorded, which clones used it last
  and when (:func:`clone_id`), and which runs hold it now. A clean-up removes only what its ledger
  records, and never what a live run holds or another clone used within its keep days.

Example:
    >>> state = run_state(run_token())
    >>> state
    'live'
    >>> run_state("another-machine:/tmp/x.lock"), run_state("not a token")
    ('unknown', 'unknown')
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from builder.config.files import atomic_write, locked
from builder.config.state import state_dir

RunState = Literal["live", "gone", "unknown"]
#: The ledger of files the builder wrote that name an image by digest (``builder slurm``'s scripts,
#: keyed by path): ``builder gc`` keeps an image while such a file names it.
REFERENCES = "references"

_RUN: dict[str, Any] = {}
_RUN_GUARD = threading.Lock()


def machine_id() -> str:
    """This machine: systemd's ``/etc/machine-id`` (unique per installation, unlike a hostname), else
    the hostname and this boot's ID."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        with contextlib.suppress(OSError):
            if value := Path(path).read_text().strip():
                return value
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "-"
    return f"{socket.gethostname()}-{boot}"


def runs_dir() -> Path:
    return state_dir() / "runs"


def run_token() -> str:
    """This process's run: ``<machine id>:<lock file>``, the lease held until the process exits.

    The lock is taken on a file under a temporary name and then renamed into place, so no one ever
    finds the file of a live run unlocked (:func:`clear_gone_runs` removes unlocked ones).
    """
    with _RUN_GUARD:
        if _RUN.get("pid") != os.getpid():  # first call, or a forked child (which holds no lock)
            folder = runs_dir()
            folder.mkdir(parents=True, exist_ok=True)
            name = f"{secrets.token_hex(8)}.lock"
            temporary = folder / f".{name}.new"
            handle = open(temporary, "w", encoding="utf-8")  # noqa: SIM115 - held for the process's life
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(json.dumps({"pid": os.getpid(), "started": time.time()}) + "\n")
            handle.flush()
            os.replace(temporary, folder / name)
            _RUN.update(pid=os.getpid(), handle=handle, path=folder / name)
            atexit.register(_end_run, folder / name)
        return f"{machine_id()}:{_RUN['path']}"


def _end_run(path: Path) -> None:
    """At a clean exit: the lease file goes (records naming it read as ``gone``)."""
    if _RUN.get("path") == path and _RUN.get("pid") == os.getpid():
        path.unlink(missing_ok=True)
        _RUN["handle"].close()


def run_state(token: str) -> RunState:
    """Whether the run *token* (a :func:`run_token`) is ``live`` (its lease is held), ``gone`` (its
    lock file is free, or absent from this user's runs folder) or ``unknown`` (another machine's,
    another user's, or not a token: never act on it).
    """
    machine, sep, path_text = token.rpartition(":")
    if not sep or machine != machine_id() or not path_text.endswith(".lock"):
        return "unknown"
    path = Path(path_text)
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return "gone" if path.parent == runs_dir() else "unknown"
    except OSError:
        return "unknown"  # another user's
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return "live"
        except OSError:
            return "unknown"
        return "gone"


def clear_gone_runs() -> list[Path]:
    """Remove the lease files of runs that ended without removing theirs (killed): records naming
    them read as ``gone`` either way. Returns the files removed."""
    cleared = []
    for path in sorted(runs_dir().glob("*.lock")) if runs_dir().is_dir() else []:
        if run_state(f"{machine_id()}:{path}") == "gone":
            path.unlink(missing_ok=True)
            cleared.append(path)
    return cleared


def clone_id(root: Path) -> str:
    """A clone of the project, as a ledger names it: its resolved folder."""
    return str(root.resolve())


@dataclass
class Record:
    """One thing the builder made or fetched: *facts* (what a store needs to remove it: a digest, a
    size), when it was recorded, the clones that used it last (clone -> time) and the runs that hold
    it now."""

    facts: dict[str, Any] = field(default_factory=dict)
    recorded: float = 0.0
    clones: dict[str, float] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)

    def use(self, clone: str | None, run: str | None, now: float) -> None:
        """Used now by *clone* (if given), held by *run* (if given); runs that are gone are dropped."""
        if clone is not None:
            self.clones[clone] = now
        self.runs = [r for r in self.runs if run_state(r) != "gone"]
        if run is not None and run not in self.runs:
            self.runs.append(run)

    def last_used(self) -> float:
        return max([self.recorded, *self.clones.values()])

    def held(self) -> bool:
        """Whether a run holds it that is, or may be, alive (an unknown run counts as alive)."""
        return any(run_state(r) != "gone" for r in self.runs)

    def used_by_others(self, clone: str | None, keep_days: float, now: float | None = None) -> bool:
        """Whether a clone other than *clone* used it within *keep_days*."""
        since = (time.time() if now is None else now) - keep_days * 86400
        return any(when >= since for c, when in self.clones.items() if c != clone)

    def removable(self, clone: str | None, keep_days: float, now: float | None = None) -> bool:
        """No live run holds it and no other clone used it within *keep_days*."""
        return not self.held() and not self.used_by_others(clone, keep_days, now)


class Ledger:
    """The records of one store, in a JSON file (``<state>/owned/<store>.json`` unless *path* is
    given: a store shared beyond this user keeps its ledger beside it). Every change is read,
    modified and written under the ledger's lock (*lock*: the store's own, where it has one, so
    that its records change together with its files), atomically.

    Example:
        >>> import tempfile
        >>> ledger = Ledger("wheels", Path(tempfile.mkdtemp()) / "wheels.json")
        >>> ledger.record("a.whl", clone="/src/one", hold=True, facts={"sha256": "00"})
        >>> ledger.records()["a.whl"].held(), ledger.records()["a.whl"].removable("/src/two", 7)
        (True, False)
        >>> ledger.release(["a.whl"])
        >>> ledger.records()["a.whl"].removable("/src/one", 7)
        True
        >>> ledger.forget(["a.whl"]); ledger.records()
        {}
    """

    def __init__(self, store: str, path: Path | None = None, lock: Path | None = None) -> None:
        self.store = store
        self.path = path if path is not None else state_dir() / "owned" / f"{store}.json"
        self.lock = lock  # a store that has a lock of its own (the wheelhouse's) changes its records under it

    def _lock(self) -> Path:
        return self.lock if self.lock is not None else self.path.with_name(f".{self.path.name}.lock")

    def _read(self) -> dict[str, Record]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # absent or damaged: nothing is known to be ours
            return {}
        records = {}
        for key, value in (data.get("records") or {}).items() if isinstance(data, dict) else []:
            with contextlib.suppress(TypeError, ValueError, AttributeError):
                records[str(key)] = Record(dict(value.get("facts") or {}), float(value.get("recorded") or 0),
                                           {str(c): float(t) for c, t in (value.get("clones") or {}).items()},
                                           [str(r) for r in value.get("runs") or []])
        return records

    def _write(self, records: dict[str, Record]) -> None:
        data = {"store": self.store, "records": {k: vars(r) for k, r in sorted(records.items())}}
        # Compact: Python's C encoder (three times faster here than with indent), and a build writes
        # its ledgers a dozen times.
        atomic_write(self.path, json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")

    def discard(self) -> None:
        """Remove the ledger (and its own lock file): the store it is about is gone."""
        with locked(self._lock()):
            self.path.unlink(missing_ok=True)
        if self.lock is None:
            self._lock().unlink(missing_ok=True)

    def records(self) -> dict[str, Record]:
        with locked(self._lock(), shared=True):
            return self._read()

    @contextlib.contextmanager
    def editing(self) -> Iterator[dict[str, Record]]:
        """The records to change in place, written back when the block ends without an error."""
        with locked(self._lock()):
            records = self._read()
            yield records
            self._write(records)

    def record(self, key: str, *, clone: str | None = None, hold: bool = False,
               facts: dict[str, Any] | None = None) -> None:
        """Record *key* as the builder's (or refresh it): used now by *clone*, held by this run with *hold*."""
        self.record_many([key], clone=clone, hold=hold, facts={key: facts} if facts else None)

    def record_many(self, keys: Iterable[str], *, clone: str | None = None, hold: bool = False,
                    facts: dict[str, dict[str, Any]] | None = None) -> None:
        now, run = time.time(), run_token() if hold else None
        with self.editing() as records:
            for key in keys:
                entry = records.setdefault(key, Record(recorded=now))
                entry.facts.update((facts or {}).get(key) or {})
                entry.use(clone, run, now)

    def release(self, keys: Iterable[str] | None = None) -> None:
        """This run holds *keys* (None: everything it holds here) no longer."""
        run = run_token()
        with self.editing() as records:
            for key in records if keys is None else keys:
                if key in records:
                    records[key].runs = [r for r in records[key].runs if r != run]

    def forget(self, keys: Iterable[str]) -> None:
        """*keys* are no longer the builder's (removed, or found gone)."""
        with self.editing() as records:
            for key in keys:
                records.pop(key, None)

    def select(self, wanted: Callable[[str, Record], bool]) -> dict[str, Record]:
        return {k: r for k, r in self.records().items() if wanted(k, r)}
