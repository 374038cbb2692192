"""The shared wheelhouse: where resolved wheels live, and which of them were verified by hash.

One folder for all targets and all clones (``BUILDER_WHEELHOUSE``, else the user's state
folder). A file is trusted only with its locked sha256; a verified (size, mtime_ns, sha256) is
remembered in a sidecar file so that a no-op build does not re-hash gigabytes of wheels.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from builder.config.files import atomic_write
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


#: Sidecar in the wheelhouse: {file: [size, mtime_ns, sha256]} of files whose hash was checked.
VERIFIED = ".verified.json"


def stamp(path: Path, sha256: str) -> list[object]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, sha256]

def _stamps(house: Path) -> dict[str, list[object]]:
    try:
        data = json.loads((house / VERIFIED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}

def remember(house: Path, changes: dict[str, list[object] | None]) -> None:
    """Merge *changes* (None: forget) into the stamps; re-read first, other builds share the file."""
    if not changes:
        return
    stamps = _stamps(house)
    for name, stamp in changes.items():
        if stamp is None:
            stamps.pop(name, None)
        else:
            stamps[name] = stamp
    atomic_write(house / VERIFIED, json.dumps(stamps, sort_keys=True, indent=1) + "\n")

def missing(pins: list[Pin]) -> list[Pin]:
    """The pins whose wheel is not in the wheelhouse with its locked sha256; a wrong file is removed.

    Hashing every locked file on each no-op build is too slow (CUDA torch is ~3 GB), so a
    verified (size, mtime_ns, sha256) is remembered per file and only changed files are re-hashed.
    """
    house = location()
    stamps = _stamps(house)
    absent: list[Pin] = []
    changes: dict[str, list[object] | None] = {}
    for pin in pins:
        path = house / pin.filename
        try:
            current = stamp(path, pin.sha256)
        except FileNotFoundError:
            absent.append(pin)
            continue
        if stamps.get(pin.filename) == current:
            continue
        if sha256_file(path) == pin.sha256:
            changes[pin.filename] = current
        else:  # truncated or replaced: never serve it to a build
            path.unlink(missing_ok=True)
            changes[pin.filename] = None
            absent.append(pin)
    remember(house, changes)
    return absent


#: In every layer's folder beside its wheels, holding the layer's name: a context is never empty.
#: A step mounting an empty named context (cpu's ``packages``) took its cache locally, but a second
#: engine never matched it in the registry cache written from there, so that step ran again on
#: every fresh runner (``tests/engine/test_registry_cache.py`` failed in CI, 8 of 9 steps cached).
#: BuildKit's side is not pinned down: a small Dockerfile mounting an empty context did not miss.
#: ``--find-links`` reads wheels only: pip and uv pass over this file.
MARKER = "LAYER"


def context_folder(layers: Mapping[str, Sequence[Pin]]) -> Path:
    """Where :func:`build_context` puts these layers' wheels (nothing is written)."""
    # What the folder holds, marker included: a folder staged without it is never taken for this one.
    listing = json.dumps({layer: sorted([MARKER, *(p.filename for p in pins)]) for layer, pins in layers.items()},
                         sort_keys=True)
    # Beside the wheels: the same file system, so hard links.
    return location() / ".contexts" / hashlib.sha256(listing.encode()).hexdigest()[:32]


def build_context(layers: Mapping[str, Sequence[Pin]]) -> Path:
    """The wheels' named build contexts: one folder per layer holding exactly that layer's wheels
    (and :data:`MARKER`), each the context ``wheels-<layer>`` (:func:`builder.images.plan.wheel_contexts`).

    A ``RUN`` mounts its layer's folder alone, and BuildKit keys its cache on the content of what
    is mounted (not on file times), so a layer's cache depends on its own wheels only, as on any
    runner. Content-addressed (``<wheelhouse>/.contexts/<digest>``) and made of hard links into the
    wheelhouse (copies across file systems): the same wheels give the same folder, ready for
    ``docker buildx bake`` as well, and another build's folder is never touched.
    """
    folder = context_folder(layers)
    if folder.is_dir():
        return folder
    house, root = location(), folder.parent
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
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
        try:
            staging.rename(folder)
        except OSError:  # another build made the same folder first: the same content
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder
