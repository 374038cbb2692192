"""The shared wheelhouse: where resolved wheels live, and which of them are the builder's and verified by
hash (the per-layer folders a build mounts them from: :mod:`builder.wheels.contexts`).

One folder for all targets and all clones (``BUILDER_WHEELHOUSE``, else the user's state
folder). What in it is the builder's own is what its ledger says (:data:`LEDGER`, beside the wheels,
since a wheelhouse given by ``BUILDER_WHEELHOUSE`` may be shared beyond this user: a
:class:`builder.config.ownership.Ledger`): a record per wheel the builder fetched (its file name;
facts: ``fetched`` and its ``verified`` stamp) and per folder it staged
(``.contexts/<hash>``), each with the clones that used it last and the runs that hold it now.
A file the builder found there (a note, another project's wheel) is never altered or removed: one
that a lock pins with its sha256 is used, its record holding only its ``verified`` stamp.

A file is trusted only with its locked sha256. Its verified stamp (inode, size, mtime_ns, ctime_ns,
sha256) spares a no-op build the re-hashing of gigabytes of wheels, as pip and uv do: any write to a
file moves its ctime, which no one can set back, so a file altered in place is hashed again even
when its mtime was reset. A staged folder is checked against those stamps before each build
(:func:`builder.wheels.contexts.build_context`). Everything that changes the ledger, removes a wheel
or touches ``.contexts`` holds :func:`lock_path`, the ledger's lock too.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import stat as stat_mode
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from builder.config.errors import TargetFailed, UserError
from builder.config.files import locked
from builder.config.ownership import Ledger, Record, run_token
from builder.config.state import state_dir
from builder.wheels.lockfile import Pin, wheel_name_problem


def location() -> Path:
    """Shared wheel cache (all targets, all clones): BUILDER_WHEELHOUSE or the user cache."""
    path = Path(os.environ.get("BUILDER_WHEELHOUSE") or state_dir() / "wheels")
    path.mkdir(parents=True, exist_ok=True)
    return path


def lock_path() -> Path:
    """The wheelhouse's lock file (:func:`builder.config.files.locked`, exclusive): held by whoever
    changes the ledger, removes or brings in a wheel, or stages, checks, replaces or removes a folder
    under ``.contexts`` (staging here, ``builder gc``).

    Example:
        >>> lock_path().name
        '.lock'
    """
    return location() / ".lock"


#: The wheelhouse's ledger, beside the wheels (its lock is :func:`lock_path`).
LEDGER = ".ledger.json"
#: Where the builder kept its verified stamps before it kept a ledger ({file: stamp}): read once, by
#: :func:`_before_the_ledger`, then removed.
BEFORE_LEDGER_STAMPS = ".verified.json"
#: The clone a record taken in from before the ledger names (last used: the file's mtime).
BEFORE_LEDGER = "(before the ledger)"
#: In every layer's folder beside its wheels, holding the layer's name: a context is never empty.
#: A step mounting an empty named context (cpu's ``packages``) took its cache locally, but a second
#: engine never matched it in the registry cache written from there, so that step ran again on
#: every fresh runner (``tests/engine/test_registry_cache.py`` failed in CI, 8 of 9 steps cached).
#: BuildKit's side is not pinned down: a small Dockerfile mounting an empty context did not miss.
#: ``--find-links`` reads wheels only: pip and uv pass over this file.
MARKER = "LAYER"
#: The folder of the staged folders, and the prefix of their ledger keys.
CONTEXTS = ".contexts"
#: The prefix of a folder being staged, or replaced and being removed, under ``.contexts``, and of
#: a wheel being copied in (:func:`adopt`): only ever there while a process holds the lock, so any
#: found by the lock's holder is a killed run's.
STAGING = ".staging-"


def ledger(house: Path | None = None) -> Ledger:
    """The wheelhouse's ledger (the records themselves: :func:`records`)."""
    house = location() if house is None else house
    return Ledger("wheelhouse", house / LEDGER, lock=house / ".lock")


def context_key(folder: Path) -> str:
    """The ledger's key of a staged folder: ``.contexts/<hash>``."""
    return f"{CONTEXTS}/{folder.name}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def say_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _wheel(house: Path, name: str) -> Path:
    """The wheelhouse file of the wheel *name*: a plain wheel file name, never a path (read_lock and
    the resolution refuse others first, naming their source)."""
    if problem := wheel_name_problem(name):
        raise UserError(f"wheelhouse {house}: {problem}")
    return house / name


def stat_key(st: os.stat_result) -> list[object]:
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]

def stamp(path: Path, sha256: str) -> list[object]:
    """The verified stamp of *path*, whose content hashes to *sha256* (the caller checked)."""
    return [*stat_key(path.stat()), sha256]

def stamp_of(records: Mapping[str, Record], name: str) -> list[object] | None:
    record = records.get(name)
    value = record.facts.get("verified") if record is not None else None
    return value if isinstance(value, list) and len(value) == 5 else None


def fetched(record: Record | None, path: Path) -> bool:
    """Whether *path* is a file the builder fetched, as its *record* says (not one it only found there
    and verified), and a plain file still.

    Example:
        >>> fetched(None, Path("/etc/hostname")), fetched(Record({"verified": [1, 2, 3, 4, "ab"]}), Path("/etc/hostname"))
        (False, False)
    """
    if record is None or record.facts.get("fetched") is not True:
        return False
    try:
        return stat_mode.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def editing(house: Path, say: Callable[[str], object]) -> Iterator[dict[str, Record]]:
    """The ledger's records to change in place, written back when the block ends without an error;
    the caller holds :func:`lock_path`. A wheelhouse without a ledger first takes in what the builder
    can prove it brought there before it kept one (:func:`_before_the_ledger`)."""
    book = ledger(house)
    first = not book.path.exists()
    with book.editing() as records:
        if first:
            _before_the_ledger(house, records, say)
        yield records
    if first:
        (house / BEFORE_LEDGER_STAMPS).unlink(missing_ok=True)


def records(say: Callable[[str], object] = say_stderr) -> dict[str, Record]:
    """The wheelhouse ledger's records (taking in those from before the ledger first, if it has none)."""
    house = location()
    with locked(lock_path()):
        if not ledger(house).path.exists():
            with editing(house, say):
                pass
        return ledger(house).records()


def _before_the_ledger(house: Path, records: dict[str, Record], say: Callable[[str], object]) -> None:
    """Record what the builder brought into *house* before it kept a ledger, where it can prove it:

    - a wheel its :data:`BEFORE_LEDGER_STAMPS` stamps (the builder wrote a stamp only for a file it
      had hashed against a lock's sha256) whose stat is still that stamp, or whose bytes still hash
      to it (a hard link moved its ctime);
    - a folder under ``.contexts`` laid out as the builder stages one (each layer's folder holding
      its :data:`MARKER`).

    Each counts as last used by :data:`BEFORE_LEDGER` at its mtime (``--keep-days`` keeps it as the
    age did before). Any other file is not the builder's, and is never removed.
    """
    try:
        stamps = json.loads((house / BEFORE_LEDGER_STAMPS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stamps = {}
    now = time.time()
    for name, value in sorted(stamps.items()) if isinstance(stamps, dict) else ():
        if (verified := _still_verified(house, name, value, say)) is not None:
            records[name] = Record({"fetched": True, "verified": verified}, now,
                                   {BEFORE_LEDGER: (house / name).lstat().st_mtime})
    for folder in sorted((house / CONTEXTS).iterdir()) if (house / CONTEXTS).is_dir() else ():
        layers = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() and not folder.name.startswith(".") else []
        if layers and all((p / MARKER).is_file() for p in layers):
            records[context_key(folder)] = Record(recorded=now, clones={BEFORE_LEDGER: folder.stat().st_mtime})


def _still_verified(house: Path, name: str, value: object, say: Callable[[str], object]) -> list[object] | None:
    """The current stamp of wheelhouse file *name* if its old stamp *value* still holds: its stat is the
    stamp's, or its bytes still hash to the stamp's sha256; else None."""
    if wheel_name_problem(name) or not isinstance(value, list) or len(value) != 5:
        return None
    try:
        st = (house / name).lstat()
    except OSError:
        return None
    current = [*stat_key(st), str(value[-1])]
    if not stat_mode.S_ISREG(st.st_mode) or (current != value and _hash(house / name, say) != value[-1]):
        return None
    return current


#: A file this large says it is being hashed (a few seconds each): a long check is never silent.
SAY_HASHING_BYTES = 256 << 20


def _hash(path: Path, say: Callable[[str], object]) -> str:
    size = path.stat().st_size
    if size >= SAY_HASHING_BYTES:
        say(f"wheelhouse: checking {path.name} ({size / 1e9:.2f} GB) against its locked sha256")
    return sha256_file(path)


def verified(house: Path, records: dict[str, Record], name: str, sha256: str,
              say: Callable[[str], object] = say_stderr) -> bool | None:
    """Whether wheelhouse file *name* holds *sha256*: by its stamp, else hashed (and its stamp kept in
    *records*); None when it is absent. A file of the builder's that no longer matches is removed and
    its record dropped; one that is not the builder's is left as it is (TargetFailed, naming it)."""
    path = _wheel(house, name)
    try:
        current = stamp(path, sha256)
    except FileNotFoundError:
        records.pop(name, None)
        return None
    if stamp_of(records, name) == current:
        return True
    if not stat_mode.S_ISREG(path.stat().st_mode):
        raise TargetFailed(f"wheelhouse: {path} is not a file (a device, a folder, a link to one): left as it is; "
                           "move it away, or set BUILDER_WHEELHOUSE to a folder of the builder's own")
    if _hash(path, say) == sha256:
        records.setdefault(name, Record(recorded=time.time())).facts["verified"] = current
        return True
    if not fetched(records.get(name), path):
        raise TargetFailed(f"wheelhouse: {path} is not the locked wheel (sha256 {sha256}) and not a file the "
                           f"builder fetched ({house / LEDGER} has no record of it): left as it is; move it away, "
                           "or set BUILDER_WHEELHOUSE to a folder of the builder's own")
    path.unlink(missing_ok=True)  # truncated or altered: never serve it to a build
    records.pop(name, None)
    return False

def waiting(say: Callable[[str], object]) -> Callable[[int], object]:
    """What a build waiting for the wheelhouse lock says (another build is checking or staging wheels)."""
    return lambda seconds: say(f"wheelhouse: another build holds it (checking or staging wheels); waiting "
                               f"({seconds} s)")


def missing(pins: list[Pin], clone: str | None = None, say: Callable[[str], object] = say_stderr) -> list[Pin]:
    """The pins whose wheel is not in the wheelhouse with its locked sha256; a wrong file of the
    builder's is removed (and said, in one line: the caller fetches it again). The others are used
    now by *clone* (:func:`builder.config.ownership.clone_id`) and held by this run.

    Hashing every locked file on each no-op build is too slow (CUDA torch is ~3 GB), so a
    verified stamp is remembered per file and only changed files are re-hashed.
    """
    house = location()
    absent: list[Pin] = []
    with locked(lock_path(), waiting=waiting(say)), editing(house, say) as book:
        run, now = holding(house), time.time()
        for pin in pins:
            found = verified(house, book, pin.filename, pin.sha256, say)
            if found is False:
                say(f"wheelhouse: {house / pin.filename} no longer matches its locked sha256 (altered on "
                    f"disk): removed, fetching it again")
            if found:
                book[pin.filename].use(clone, run, now)
            else:
                absent.append(pin)
    return absent


def adopt(downloads: Path, clone: str | None = None) -> None:
    """Move the wheels pip downloaded into *downloads* (a private folder) into the wheelhouse, each by
    one rename under the lock, and record each as the builder's (fetched, used by *clone*, held by this
    run): pip writes a file in place, so downloading straight into the wheelhouse let two builds at
    once rewrite a wheel that the other had verified or staged. A name already there (another build
    brought it first, or it is not the builder's) stays as it is (the hash check that follows judges
    it); a file that is not a wheel by its name stays in *downloads*."""
    house = location()
    with locked(lock_path()), editing(house, say_stderr) as book:
        run, now = holding(house), time.time()
        for path in sorted(downloads.glob("*")) if downloads.is_dir() else ():
            if wheel_name_problem(path.name) or not path.is_file() or os.path.lexists(house / path.name):
                continue
            try:
                os.rename(path, house / path.name)
            except OSError:  # another file system: a copy, renamed into place whole
                shutil.copyfile(path, house / f"{STAGING}{path.name}")
                os.rename(house / f"{STAGING}{path.name}", house / path.name)
            book[path.name] = Record({"fetched": True}, now)
            book[path.name].use(clone, run, now)


def release() -> None:
    """This run holds nothing in the wheelhouse any more (the engine is done with its staged folders)."""
    ledger().release()


#: The wheelhouses this process holds something in: each is released when it exits (:func:`holding`).
_HOLDING: set[Path] = set()


def holding(house: Path) -> str:
    """This run's token, holding something in *house*: at a clean exit it lets go of it there
    (:func:`_release_at_exit`), so that a run whose lease another user cannot read (``unknown`` to them)
    holds nothing after it ended; a killed run's hold ends with its lease."""
    if house not in _HOLDING:
        _HOLDING.add(house)
        atexit.register(_release_at_exit, house)
    return run_token()


class _Busy(Exception):
    pass


def _release_at_exit(house: Path) -> None:
    """:func:`release` for *house*, unless another process holds its lock (an exit never waits for it)."""
    def give_up(_seconds: int) -> None:
        raise _Busy

    with contextlib.suppress(_Busy, OSError), locked(house / ".lock", waiting=give_up):
        ledger(house).release()


def remove_wheels(names: Iterable[str]) -> list[str]:
    """Remove the wheels *names* that are the builder's (:func:`fetched`) and their records; forget
    the records of files and folders no longer there. Returns the names removed. Takes :func:`lock_path`."""
    house = location()
    removed = []
    with locked(lock_path()), editing(house, say_stderr) as book:
        for name in names:
            path = _wheel(house, name)
            if fetched(book.get(name), path):
                path.unlink(missing_ok=True)
                book.pop(name, None)
                removed.append(name)
        for key in [k for k in book if not os.path.lexists(house / k)]:
            book.pop(key)
    return removed


def remove_leftovers(house: Path) -> list[Path]:
    """Remove what a killed run left in the wheelhouse *house*: half-staged or half-removed folders
    under ``.contexts`` and half-copied wheels (:data:`STAGING`), and temporary files of the
    ledger's atomic writes (and of the stamps file from before the ledger).
    Both only ever exist while their process holds the lock, so the caller must hold
    :func:`lock_path`; return what was removed."""
    root = house / CONTEXTS
    stale = [*(root.glob(f"{STAGING}*") if root.is_dir() else ()), *house.glob(f"{STAGING}*.whl"),
             *house.glob(f".{LEDGER}.*.tmp"), *house.glob(f".{BEFORE_LEDGER_STAMPS}.*")]
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale
