"""The wheels' named build contexts: per layer, a folder holding exactly that layer's wheels, staged from
the wheelhouse (:mod:`builder.wheels.wheelhouse`) as hard links (copies across file systems) under
``<wheelhouse>/.contexts/<digest>``, content-addressed: the same wheels give the same folder.

A build mounts each layer's folder as the context ``wheels-<layer>``
(:func:`builder.images.plan.wheel_contexts`), or the image :mod:`builder.wheels.images` loads from it; a folder is checked against the wheelhouse's verified
stamps before each build (:func:`build_context`), never hashed again, and replaced when anything in it
changed. Everything here holds the wheelhouse's lock (:func:`builder.wheels.wheelhouse.lock_path`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from builder.config.errors import TargetFailed
from builder.config.files import atomic_write, locked
from builder.config.ownership import Record
from builder.wheels import wheelhouse
from builder.wheels.lockfile import Pin

#: The mtime of every layer's folder and its :data:`~builder.wheels.wheelhouse.MARKER` (the wheels keep their wheelhouse file's):
#: buildah (podman >= 5 builds with its layer cache) keys a RUN that mounts a build context on the
#: files' and folders' mtimes, not on their bytes alone as BuildKit does, so a context staged for a
#: changed lock missed the cache of every layer whose wheels had not changed (cpu: 5 of 23 steps cached
#: after a package was added, with podman 5.4.2).
FIXED_MTIME = 1735689600
#: In a staged folder (beside its layers' folders, in none of the contexts): the stamps of the wheels
#: that are copies, not hard links (another file system): {"<layer>/<file>": stamp}.
COPIES = ".copies.json"


def context_folder(layers: Mapping[str, Sequence[Pin]]) -> Path:
    """Where :func:`build_context` puts these layers' wheels (nothing is written)."""
    # What the folder holds, marker included: a folder staged without it is never taken for this one.
    listing = json.dumps({layer: sorted([wheelhouse.MARKER, *(p.filename for p in pins)]) for layer, pins in layers.items()},
                         sort_keys=True)
    # Beside the wheels: the same file system, so hard links.
    return wheelhouse.location() / wheelhouse.CONTEXTS / hashlib.sha256(listing.encode()).hexdigest()[:32]


def build_context(layers: Mapping[str, Sequence[Pin]], clone: str | None = None,
                  say: Callable[[str], object] = wheelhouse.say_stderr) -> Path:
    """The wheels' named build contexts: one folder per layer holding exactly that layer's wheels
    (and :data:`wheelhouse.MARKER`), each the context ``wheels-<layer>`` (:func:`builder.images.plan.wheel_contexts`).

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
    house = wheelhouse.location()
    failed = problems = None
    with locked(wheelhouse.lock_path(), waiting=wheelhouse.waiting(say)), wheelhouse.editing(house, say) as book:
        wheelhouse.remove_leftovers(house)
        run, now = wheelhouse.holding(house), time.time()
        for pin in {p.filename: p for pins in layers.values() for p in pins}.values():
            if not wheelhouse.verified(house, book, pin.filename, pin.sha256, say):
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
            book.setdefault(wheelhouse.context_key(folder), Record(recorded=now)).use(clone, run, now)
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
    without the bytes' ctime moving, so nothing is hashed. Caller holds :func:`~builder.wheels.wheelhouse.lock_path`.
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
        wanted = {wheelhouse.MARKER: None, **{p.filename: p for p in pins}}
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
            elif [*wheelhouse.stat_key(entry.stat(follow_symlinks=False)), pin.sha256] not in (
                    wheelhouse.stamp_of(records, pin.filename), copies.get(f"{layer}/{name}")):
                problems.append(f"{path} is not the verified wheel (altered or replaced since it was staged)")
    return problems


def _stage(folder: Path, layers: Mapping[str, Sequence[Pin]], house: Path, records: dict[str, Record]) -> None:
    """Stage *folder* anew beside the old one (if any), swap them, remove the old one; keep the stamps in
    *records* current (a link moves its file's ctime). Every wheel is verified there; caller holds the lock."""
    root = folder.parent
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=wheelhouse.STAGING, dir=root))
    old = root / f"{wheelhouse.STAGING}{folder.name}-replaced"
    copies: dict[str, list[object]] = {}
    try:
        for layer, pins in layers.items():
            (staging / layer).mkdir()
            (staging / layer / wheelhouse.MARKER).write_text(layer + "\n")
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
            locked_sha = (wheelhouse.stamp_of(records, rel.split("/", 1)[1]) or [""])[-1]
            copies[rel] = wheelhouse.stamp(staging / rel, str(locked_sha))
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
        for path in (folder / layer / wheelhouse.MARKER, folder / layer):
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
        if (old := wheelhouse.stamp_of(records, name)) is not None:
            try:
                records[name].facts["verified"] = wheelhouse.stamp(house / name, str(old[-1]))
            except FileNotFoundError:
                records.pop(name, None)


def remove_context(folder: Path) -> None:
    """Remove the staged *folder* (a clean-up decided it goes) and its record, keeping the stamps of
    the wheels it linked current. Takes :func:`~builder.wheels.wheelhouse.lock_path`."""
    house = wheelhouse.location()
    if folder.parent != house / wheelhouse.CONTEXTS or folder.name.startswith("."):
        raise ValueError(f"{folder} is not a staged folder of {house}")
    with locked(wheelhouse.lock_path()), wheelhouse.editing(house, wheelhouse.say_stderr) as book:
        names = {p.name for p in folder.glob("*/*")}
        valid = {n for n in names if (old := wheelhouse.stamp_of(book, n)) is not None and (house / n).exists()
                 and wheelhouse.stat_key((house / n).stat()) == old[:4]}
        shutil.rmtree(folder, ignore_errors=True)
        _restamp(house, book, valid)
        book.pop(wheelhouse.context_key(folder), None)
