"""The shared wheelhouse: where resolved wheels live, which of them were verified by hash, and the
per-layer folders a build mounts them from.

One folder for all targets and all clones (``BUILDER_WHEELHOUSE``, else the user's state
folder). A file is trusted only with its locked sha256; a verified stamp (inode, size,
mtime_ns, ctime_ns, sha256) is remembered in a sidecar file so that a no-op build does not
re-hash gigabytes of wheels, as pip and uv do: any write to a file moves its ctime, which no
one can set back, so a file altered in place is hashed again even when its mtime was reset.
A staged folder is checked against those stamps before each build (:func:`build_context`).
Everything that reads-modifies-writes the stamps, removes a wheel or touches ``.contexts``
holds :func:`lock_path`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from builder.config.errors import TargetFailed
from builder.config.files import atomic_write, locked
from builder.config.state import state_dir
from builder.images.lockfile import Pin


def location() -> Path:
    """Shared wheel cache (all targets, all clones): BUILDER_WHEELHOUSE or the user cache."""
    path = Path(os.environ.get("BUILDER_WHEELHOUSE") or state_dir() / "wheels")
    path.mkdir(parents=True, exist_ok=True)
    return path


def lock_path() -> Path:
    """The wheelhouse's lock file (:func:`builder.config.files.locked`, exclusive): held by whoever
    reads-modifies-writes :data:`VERIFIED`, removes or replaces a wheel, or stages, checks, replaces
    or removes a folder under ``.contexts`` (staging here, ``builder gc``). Never nest it.

    Example:
        >>> lock_path().name
        '.lock'
    """
    return location() / ".lock"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


#: Sidecar in the wheelhouse: {file: [inode, size, mtime_ns, ctime_ns, sha256]} of files whose hash was
#: checked (an older stamp without the inode and ctime never matches: that file is hashed once more).
VERIFIED = ".verified.json"


def _key(st: os.stat_result) -> list[object]:
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]

def stamp(path: Path, sha256: str) -> list[object]:
    """The verified stamp of *path*, whose content hashes to *sha256* (the caller checked)."""
    return [*_key(path.stat()), sha256]

def _stamps(house: Path) -> dict[str, list[object]]:
    try:
        data = json.loads((house / VERIFIED).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent, or not JSON: every file is hashed again
        return {}
    return data if isinstance(data, dict) else {}

def _write_stamps(house: Path, stamps: Mapping[str, list[object]]) -> None:
    """Write the stamps (the caller holds the lock)."""
    atomic_write(house / VERIFIED, json.dumps(stamps, sort_keys=True, indent=1) + "\n")

def remember(house: Path, changes: dict[str, list[object] | None]) -> None:
    """Merge *changes* (None: forget) into the stamps, under the lock: other builds share the file."""
    if not changes:
        return
    with locked(lock_path()):
        stamps = _stamps(house)
        for name, value in changes.items():
            if value is None:
                stamps.pop(name, None)
            else:
                stamps[name] = value
        _write_stamps(house, stamps)

#: A file this large says it is being hashed (a few seconds each): a long check is never silent.
SAY_HASHING_BYTES = 256 << 20


def _verified(house: Path, stamps: dict[str, list[object]], name: str, sha256: str,
              say: Callable[[str], object] = _stderr) -> bool | None:
    """Whether wheelhouse file *name* holds *sha256*: by its stamp, else hashed (and *stamps* updated);
    None when it is absent. A file that no longer matches is removed and its stamp forgotten."""
    path = house / name
    try:
        current = stamp(path, sha256)
    except FileNotFoundError:
        stamps.pop(name, None)
        return None
    if stamps.get(name) == current:
        return True
    if int(str(current[1])) >= SAY_HASHING_BYTES:
        say(f"wheelhouse: checking {name} ({int(str(current[1])) / 1e9:.2f} GB) against its locked sha256")
    if sha256_file(path) == sha256:
        stamps[name] = current
        return True
    path.unlink(missing_ok=True)  # truncated or altered: never serve it to a build
    stamps.pop(name, None)
    return False

def _waiting(say: Callable[[str], object]) -> Callable[[int], object]:
    """What a build waiting for the wheelhouse lock says (another build is checking or staging wheels)."""
    return lambda seconds: say(f"wheelhouse: another build holds it (checking or staging wheels); waiting "
                               f"({seconds} s)")


def missing(pins: list[Pin], say: Callable[[str], object] = _stderr) -> list[Pin]:
    """The pins whose wheel is not in the wheelhouse with its locked sha256; a wrong file is removed
    (and said, in one line: the caller fetches it again).

    Hashing every locked file on each no-op build is too slow (CUDA torch is ~3 GB), so a
    verified stamp is remembered per file and only changed files are re-hashed.
    """
    house = location()
    absent: list[Pin] = []
    with locked(lock_path(), waiting=_waiting(say)):
        stamps = _stamps(house)
        before = dict(stamps)
        for pin in pins:
            found = _verified(house, stamps, pin.filename, pin.sha256, say)
            if found is False:
                say(f"wheelhouse: {house / pin.filename} no longer matches its locked sha256 (altered on "
                    f"disk): removed, fetching it again")
            if not found:
                absent.append(pin)
        if stamps != before:
            _write_stamps(house, stamps)
    return absent


def adopt(downloads: Path) -> None:
    """Move the wheels pip downloaded into *downloads* (a private folder) into the wheelhouse, each by
    one rename under the lock: pip writes a file in place, so downloading straight into the wheelhouse
    let two builds at once rewrite a wheel that the other had verified or staged. A name another
    build brought first stays as it is (the hash check that follows judges it)."""
    house = location()
    with locked(lock_path()):
        for path in downloads.glob("*") if downloads.is_dir() else ():
            if (house / path.name).exists():
                continue
            try:
                os.rename(path, house / path.name)
            except OSError:  # another file system: a copy, renamed into place whole
                shutil.copyfile(path, house / f"{STAGING}{path.name}")
                os.rename(house / f"{STAGING}{path.name}", house / path.name)


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
    return location() / ".contexts" / hashlib.sha256(listing.encode()).hexdigest()[:32]


def build_context(layers: Mapping[str, Sequence[Pin]], say: Callable[[str], object] = _stderr) -> Path:
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
    Raises TargetFailed when a wheel is absent or altered in the wheelhouse (the caller fetched it).
    """
    folder = context_folder(layers)
    house = location()
    with locked(lock_path(), waiting=_waiting(say)):
        remove_leftovers(house)
        stamps = _stamps(house)
        before = dict(stamps)
        try:
            for pin in {p.filename: p for pins in layers.values() for p in pins}.values():
                if not _verified(house, stamps, pin.filename, pin.sha256, say):
                    raise TargetFailed(f"wheelhouse: {house / pin.filename} is absent or no longer matches its "
                                       f"locked sha256 (removed); run the build again to fetch it")
            problems = check_context(folder, layers, stamps) if folder.exists() else None
            if problems == []:
                _fixed_times(folder, layers)  # one staged before FIXED_MTIME was set has its own times
                return folder
            _stage(folder, layers, house, stamps)
        finally:
            if stamps != before:
                _write_stamps(house, stamps)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        say(f"wheelhouse: {problems[0]}{more}: staged {folder.name} afresh, the old folder removed")
    return folder


def check_context(folder: Path, layers: Mapping[str, Sequence[Pin]], stamps: Mapping[str, list[object]]) -> list[str]:
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
                    stamps.get(pin.filename), copies.get(f"{layer}/{name}")):
                problems.append(f"{path} is not the verified wheel (altered or replaced since it was staged)")
    return problems


def _stage(folder: Path, layers: Mapping[str, Sequence[Pin]], house: Path, stamps: dict[str, list[object]]) -> None:
    """Stage *folder* anew beside the old one (if any), swap them, remove the old one; keep *stamps*
    current (a link moves its file's ctime). Every wheel is verified in *stamps*; caller holds the lock."""
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
            copies[rel] = stamp(staging / rel, str(stamps[rel.split("/", 1)[1]][-1]))
        if copies:
            atomic_write(staging / COPIES, json.dumps(copies, sort_keys=True, indent=1) + "\n")
        if folder.exists():
            folder.rename(old)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        _restamp(house, stamps, {p.filename for pins in layers.values() for p in pins})


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


def _restamp(house: Path, stamps: dict[str, list[object]], names: Iterable[str]) -> None:
    """Re-stamp *names*, verified just before under the lock held since: linking, unlinking or setting
    the mtime of a file moves its ctime, which would otherwise make the next build hash it again."""
    for name in names:
        if name in stamps:
            try:
                stamps[name] = stamp(house / name, str(stamps[name][-1]))
            except FileNotFoundError:
                stamps.pop(name, None)


def remove_context(folder: Path) -> None:
    """Remove the staged *folder* (``builder gc``: one no lock references), keeping the stamps of the
    wheels it linked current. Takes :func:`lock_path`."""
    house = location()
    with locked(lock_path()):
        stamps = _stamps(house)
        names = {p.name for p in folder.glob("*/*")}
        valid = {n for n in names if n in stamps and (house / n).exists()
                 and _key((house / n).stat()) == stamps[n][:4]}
        shutil.rmtree(folder, ignore_errors=True)
        if valid:
            _restamp(house, stamps, valid)
            _write_stamps(house, stamps)


def remove_leftovers(house: Path) -> list[Path]:
    """Remove what a killed run left in the wheelhouse *house*: half-staged or half-removed folders
    under ``.contexts`` and half-copied wheels (:data:`STAGING`), and temporary files of
    :data:`VERIFIED`'s atomic writes.
    Both only ever exist while their process holds the lock, so the caller must hold
    :func:`lock_path`; return what was removed."""
    root = house / ".contexts"
    stale = [*(root.glob(f"{STAGING}*") if root.is_dir() else ()), *house.glob(f"{STAGING}*"),
             *house.glob(f".{VERIFIED}.*")]
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale
