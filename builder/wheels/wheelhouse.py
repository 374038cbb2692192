"""The shared wheelhouse: where resolved wheels live, which of them are the builder's and verified by
hash, and the per-layer folders a build mounts them from.

One folder for all targets and all clones (``BUILDER_WHEELHOUSE``, else the user's state
folder). What in it is the builder's own is what its ledger says (:data:`LEDGER`, beside the wheels,
since a wheelhouse given by ``BUILDER_WHEELHOUSE`` may be shared beyond this user: a
:class:`builder.config.ownership.Ledger`): a record per wheel the builder fetched (its file name;
facts: ``fetched`` and its ``verified`` stamp) and per folder it staged
(``.contexts/<hash>``), each with the clones that used it last and the runs that hold it now.
A file the builder found there (a note, another project's wheel) is never altered or removed: one
that a lock pins with its sha256 is used, its record holding only its ``verified`` stamp.

A file is trusted only with its locked sha256. Its verified stamp (inode, size, mtime_ns,
ctime_ns, sha256) spares a no-op build the re-hashing of gigabytes of wheels, as pip and uv do: any
write to a file moves its ctime, which no one can set back, so a file altered in place is hashed
again even when its mtime was reset. A staged folder is checked against those stamps before each
build (:func:`build_context`). Everything that changes the ledger, removes a wheel or touches
``.contexts`` holds :func:`lock_path`, the ledger's lock too.
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
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from builder.config.errors import TargetFailed, UserError
from builder.config.files import atomic_write, locked
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
#: The folder of the staged folders, and the prefix of their ledger keys.
CONTEXTS = ".contexts"


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


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _wheel(house: Path, name: str) -> Path:
    """The wheelhouse file of the wheel *name*: a plain wheel file name, never a path (read_lock and
    the resolution refuse others first, naming their source)."""
    if problem := wheel_name_problem(name):
        raise UserError(f"wheelhouse {house}: {problem}")
    return house / name


def _key(st: os.stat_result) -> list[object]:
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]

def stamp(path: Path, sha256: str) -> list[object]:
    """The verified stamp of *path*, whose content hashes to *sha256* (the caller checked)."""
    return [*_key(path.stat()), sha256]

def _stamp(records: Mapping[str, Record], name: str) -> list[object] | None:
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
def _records(house: Path, say: Callable[[str], object]) -> Iterator[dict[str, Record]]:
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


def records(say: Callable[[str], object] = _stderr) -> dict[str, Record]:
    """The wheelhouse ledger's records (taking in those from before the ledger first, if it has none)."""
    house = location()
    with locked(lock_path()):
        if not ledger(house).path.exists():
            with _records(house, say):
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
    current = [*_key(st), str(value[-1])]
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


def _verified(house: Path, records: dict[str, Record], name: str, sha256: str,
              say: Callable[[str], object] = _stderr) -> bool | None:
    """Whether wheelhouse file *name* holds *sha256*: by its stamp, else hashed (and its stamp kept in
    *records*); None when it is absent. A file of the builder's that no longer matches is removed and
    its record dropped; one that is not the builder's is left as it is (TargetFailed, naming it)."""
    path = _wheel(house, name)
    try:
        current = stamp(path, sha256)
    except FileNotFoundError:
        records.pop(name, None)
        return None
    if _stamp(records, name) == current:
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

def _waiting(say: Callable[[str], object]) -> Callable[[int], object]:
    """What a build waiting for the wheelhouse lock says (another build is checking or staging wheels)."""
    return lambda seconds: say(f"wheelhouse: another build holds it (checking or staging wheels); waiting "
                               f"({seconds} s)")


def missing(pins: list[Pin], clone: str | None = None, say: Callable[[str], object] = _stderr) -> list[Pin]:
    """The pins whose wheel is not in the wheelhouse with its locked sha256; a wrong file of the
    builder's is removed (and said, in one line: the caller fetches it again). The others are used
    now by *clone* (:func:`builder.config.ownership.clone_id`) and held by this run.

    Hashing every locked file on each no-op build is too slow (CUDA torch is ~3 GB), so a
    verified stamp is remembered per file and only changed files are re-hashed.
    """
    house = location()
    absent: list[Pin] = []
    with locked(lock_path(), waiting=_waiting(say)), _records(house, say) as book:
        run, now = _holding(house), time.time()
        for pin in pins:
            found = _verified(house, book, pin.filename, pin.sha256, say)
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
    with locked(lock_path()), _records(house, _stderr) as book:
        run, now = _holding(house), time.time()
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


#: The wheelhouses this process holds something in: each is released when it exits (:func:`_holding`).
_HOLDING: set[Path] = set()


def _holding(house: Path) -> str:
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


#: In every layer's folder beside its wheels, holding the layer's name: a context is never empty.
#: A step mounting an empty named context (cpu's ``packages``) took its cache locally, but a second
#: engine never matched it in the registry cache written from there, so that step ran again on
#: every fresh runner (``tests/engine/test_registry_cache.py`` failed in CI, 8 of 9 steps cached).
#: BuildKit's side is not pinned down: a small Dockerfile mounting an empty context did not miss.
#: ``--find-links`` reads wheels only: pip and uv pass over this file.
MARKER = "LAYER"
#: The mtime of every layer's folder and its :data:`MARKER` (the wheels keep their wheelhouse file's):
#: buildah (podman >= 5 builds with its layer cache) keys a RUN that mounts a build context on the
#: files' and folders' mtimes, not on their bytes alone as BuildKit does, so a context staged for a
#: changed lock missed the cache of every layer whose wheels had not changed (cpu: 5 of 23 steps cached
#: after a package was added, with podman 5.4.2).
FIXED_MTIME = 1735689600
#: In a staged folder (beside its layers' folders, in none of the contexts): the stamps of the wheels
#: that are copies, not hard links (another file system): {"<layer>/<file>": stamp}.
COPIES = ".copies.json"
#: The prefix of a folder being staged, or replaced and being removed, under ``.contexts``, and of
#: a wheel being copied in (:func:`adopt`): only ever there while a process holds the lock, so any
#: found by the lock's holder is a killed run's.
STAGING = ".staging-"


def context_folder(layers: Mapping[str, Sequence[Pin]]) -> Path:
    """Where :func:`build_context` puts these layers' wheels (nothing is written)."""
    # What the folder holds, marker included: a folder staged without it is never taken for this one.
    listing = json.dumps({layer: sorted([MARKER, *(p.filename for p in pins)]) for layer, pins in layers.items()},
                         sort_keys=True)
    # Beside the wheels: the same file system, so hard links.
    return location() / CONTEXTS / hashlib.sha256(listing.encode()).hexdigest()[:32]


def build_context(layers: Mapping[str, Sequence[Pin]], clone: str | None = None,
                  say: Callable[[str], object] = _stderr) -> Path:
    """The wheels' named build contexts: one folder per layer holding exactly that layer's wheels
    (and :data:`MARKER`), each the context ``wheels-<layer>`` (:func:`builder.images.plan.wheel_contexts`).

    A ``RUN`` mounts its layer's folder alone, and BuildKit keys its cache on the content of what
    is mounted (not on file times), so a layer's cache depends on its own wheels only, as on any
    runner. Content-addressed (``<wheelhouse>/.contexts/<digest>``) and made of hard links into the
    wheelhouse (copies across file systems): the same wheels give the same folder, ready for
    ``docker buildx bake`` as well.

    An existing folder is used only when every file in it checks out (:func:`check_context`):
    each staged wheel is the verified wheelhouse file (a hard link shares its inode and its stat)
    or a copy with its own stamp. Else it is replaced by a freshly staged one and removed, and
    *say* gets one line naming the file. Staged files are never altered in place: BuildKit syncs a
    named context by size and mtime, so a replaced file also gets an mtime the old one did not have.
    The folder and its wheels are recorded as used now by *clone* and held by this run, until it
    ends or calls :func:`release`: no clean-up removes them meanwhile.
    Raises TargetFailed when a wheel is absent or altered in the wheelhouse (the caller fetched it).
    """
    folder = context_folder(layers)
    house = location()
    failed = problems = None
    with locked(lock_path(), waiting=_waiting(say)), _records(house, say) as book:
        remove_leftovers(house)
        run, now = _holding(house), time.time()
        for pin in {p.filename: p for pins in layers.values() for p in pins}.values():
            if not _verified(house, book, pin.filename, pin.sha256, say):
                failed = TargetFailed(f"wheelhouse: {house / pin.filename} is absent or no longer matches its "
                                      f"locked sha256 (removed); run the build again to fetch it")
                break
            book[pin.filename].use(clone, run, now)
        if failed is None:
            problems = check_context(folder, layers, book) if folder.exists() else None
            if problems == []:
                _fixed_times(folder, layers)  # one staged before FIXED_MTIME was set has its own times
            else:
                _stage(folder, layers, house, book)
            book.setdefault(context_key(folder), Record(recorded=now)).use(clone, run, now)
    if failed is not None:
        raise failed
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        say(f"wheelhouse: {problems[0]}{more}: staged {folder.name} afresh, the old folder removed")
    return folder


def check_context(folder: Path, layers: Mapping[str, Sequence[Pin]], records: Mapping[str, Record]) -> list[str]:
    """What is wrong with the staged *folder* for *layers*, a phrase per file naming it ([]: nothing).

    A wheel passes when its stat (inode, size, mtime, ctime) is its wheelhouse file's verified stamp
    (a hard link: the same inode), or its own stamp in :data:`COPIES` (a copy); no stat changes
    without the bytes' ctime moving, so nothing is hashed. Caller holds :func:`lock_path`.
    """
    problems: list[str] = []
    try:
        copies = json.loads((folder / COPIES).read_text(encoding="utf-8"))
    except FileNotFoundError:
        copies = {}
    except (OSError, ValueError):
        copies = None
    if not isinstance(copies, dict):
        copies, problems = {}, [f"{folder / COPIES} is unreadable"]
    for layer, pins in layers.items():
        wanted = {MARKER: None, **{p.filename: p for p in pins}}
        try:
            found = {entry.name: entry for entry in os.scandir(folder / layer)}
        except OSError:
            problems.append(f"{folder / layer} is missing")
            continue
        problems += [f"{folder / layer / name} is not a staged file" for name in sorted(set(found) - set(wanted))]
        for name, pin in wanted.items():
            entry, path = found.get(name), folder / layer / name
            if entry is None or not entry.is_file(follow_symlinks=False):
                problems.append(f"{path} is missing")
            elif pin is None:
                if path.read_text(encoding="utf-8", errors="replace") != layer + "\n":
                    problems.append(f"{path} was altered")
            elif [*_key(entry.stat(follow_symlinks=False)), pin.sha256] not in (
                    _stamp(records, pin.filename), copies.get(f"{layer}/{name}")):
                problems.append(f"{path} is not the verified wheel (altered or replaced since it was staged)")
    return problems


def _stage(folder: Path, layers: Mapping[str, Sequence[Pin]], house: Path, records: dict[str, Record]) -> None:
    """Stage *folder* anew beside the old one (if any), swap them, remove the old one; keep the stamps in
    *records* current (a link moves its file's ctime). Every wheel is verified there; caller holds the lock."""
    root = folder.parent
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=root))
    old = root / f"{STAGING}{folder.name}-replaced"
    copies: dict[str, list[object]] = {}
    try:
        for layer, pins in layers.items():
            (staging / layer).mkdir()
            (staging / layer / MARKER).write_text(layer + "\n")
            for pin in pins:
                source, dest = house / pin.filename, staging / layer / pin.filename
                try:
                    os.link(source, dest)
                except OSError:
                    shutil.copy2(source, dest)
                    copies[f"{layer}/{pin.filename}"] = []
        _fixed_times(staging, layers)
        if folder.exists():
            _new_mtimes(staging, folder)
        for rel in copies:
            copies[rel] = stamp(staging / rel, str((_stamp(records, rel.split("/", 1)[1]) or [""])[-1]))
        if copies:
            atomic_write(staging / COPIES, json.dumps(copies, sort_keys=True, indent=1) + "\n")
        if folder.exists():
            folder.rename(old)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        _restamp(house, records, {p.filename for pins in layers.values() for p in pins})


def _fixed_times(folder: Path, layers: Iterable[str]) -> None:
    """Each layer's folder and its marker at :data:`FIXED_MTIME` (the folder last: its marker's touch-up does not
    move it, but a file created in it would)."""
    for layer in layers:
        for path in (folder / layer / MARKER, folder / layer):
            if path.stat().st_mtime != FIXED_MTIME:
                os.utime(path, (FIXED_MTIME, FIXED_MTIME))


def _new_mtimes(staging: Path, old: Path) -> None:
    """A staged file that replaces another file of the same size and mtime gets a new mtime: BuildKit
    would take it for the file it has already synced (it compares size and mtime, not the bytes)."""
    for path in staging.glob("*/*"):
        try:
            before = (old / path.relative_to(staging)).stat()
        except OSError:
            continue
        now = path.stat()
        if now.st_ino != before.st_ino and (now.st_size, now.st_mtime_ns) == (before.st_size, before.st_mtime_ns):
            os.utime(path, ns=(now.st_atime_ns, max(time.time_ns(), before.st_mtime_ns + 1_000_000_000)))


def _restamp(house: Path, records: dict[str, Record], names: Iterable[str]) -> None:
    """Re-stamp *names*, verified just before under the lock held since: linking, unlinking or setting
    the mtime of a file moves its ctime, which would otherwise make the next build hash it again."""
    for name in names:
        if (old := _stamp(records, name)) is not None:
            try:
                records[name].facts["verified"] = stamp(house / name, str(old[-1]))
            except FileNotFoundError:
                records.pop(name, None)


def remove_context(folder: Path) -> None:
    """Remove the staged *folder* (a clean-up decided it goes) and its record, keeping the stamps of
    the wheels it linked current. Takes :func:`lock_path`."""
    house = location()
    if folder.parent != house / CONTEXTS or folder.name.startswith("."):
        raise ValueError(f"{folder} is not a staged folder of {house}")
    with locked(lock_path()), _records(house, _stderr) as book:
        names = {p.name for p in folder.glob("*/*")}
        valid = {n for n in names if (old := _stamp(book, n)) is not None and (house / n).exists()
                 and _key((house / n).stat()) == old[:4]}
        shutil.rmtree(folder, ignore_errors=True)
        _restamp(house, book, valid)
        book.pop(context_key(folder), None)


def remove_wheels(names: Iterable[str]) -> list[str]:
    """Remove the wheels *names* that are the builder's (:func:`fetched`) and their records; forget
    the records of files and folders no longer there. Returns the names removed. Takes :func:`lock_path`."""
    house = location()
    removed = []
    with locked(lock_path()), _records(house, _stderr) as book:
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
