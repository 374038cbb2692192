"""Named build contexts served from the engine's image store: a folder of files that never change
under its key (the wheels of one layer) as a one-layer image, which BuildKit reads in place.

Why: BuildKit copies a folder context into its cache once per session (each ``docker buildx
build``) and prunes those copies with its cache; a build and its early export are two sessions,
so after a prune both sent the same 2.9 GB again (nvidia-cu130), and two targets or platforms
naming the same layer did so by turns. An image in the image store is read by every build as it
is, survives ``docker buildx prune`` and is sent nowhere.

The layer is a tar written here (neither tarfile's archive nor ``docker build`` would give the same
bytes on every machine): the folder's regular files at its root, in name order, each with mode
0644, owner 0:0 and the mtime :data:`FIXED_MTIME`, so its digest, the image's ID and every cache
key above it depend on the files' bytes and names alone. It is loaded as a ``docker save`` archive
streamed to the engine (no copy on disk). The name is under ``.invalid`` (RFC 2606: it never
resolves), so a build can't take it from a registry, and the image is used only when its one
layer's diff ID is the one the folder gives (:func:`served`).

Example:
    >>> ref("wheels-torch", "ab" * 32)
    'ml-image-builder.invalid/contexts/wheels-torch:abababababababababababababababab'
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Where these images are named: a host that never resolves (RFC 2606), so no pull can find one.
REPOSITORY = "ml-image-builder.invalid/contexts"
#: The label that says what made the image (and which context it serves).
LABEL = "io.ml-image-builder.context"
#: Every file's mtime in the layer (2025-01-01, as the staged folders' markers).
FIXED_MTIME = 1735689600
#: The image's creation time, the same moment (``docker images`` shows it).
CREATED = "2025-01-01T00:00:00Z"
BLOCK = 512
CHUNK = 1 << 20


def ref(name: str, key: str) -> str:
    """The image's name for context *name* whose content key is *key* (hex; its first 32 digits tag it)."""
    return f"{REPOSITORY}/{name}:{key[:32]}"


@dataclass(frozen=True)
class Member:
    path: Path
    header: bytes
    size: int


def _members(folder: Path) -> list[Member]:
    """The layer's files, in name order, with their tar headers (PAX where a name needs it)."""
    members = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if not entry.is_file(follow_symlinks=False):
            raise ValueError(f"{folder / entry.name} is not a regular file: a context image holds files only")
        info = tarfile.TarInfo(entry.name)
        info.size, info.mode, info.mtime = entry.stat(follow_symlinks=False).st_size, 0o644, FIXED_MTIME
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        members.append(Member(Path(entry.path), info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"), info.size))
    return members


def _padding(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def _layer_size(members: list[Member]) -> int:
    return sum(len(m.header) + m.size + len(_padding(m.size)) for m in members) + 2 * BLOCK


def _layer(members: list[Member]) -> Iterator[bytes]:
    """The layer tar's bytes, in chunks; a file whose size changed meanwhile fails it."""
    for member in members:
        yield member.header
        left = member.size
        with member.path.open("rb") as handle:
            while left:
                chunk = handle.read(min(CHUNK, left))
                if not chunk:
                    raise OSError(f"{member.path} shrank while its context image was written")
                left -= len(chunk)
                yield chunk
            if handle.read(1):
                raise OSError(f"{member.path} grew while its context image was written")
        yield _padding(member.size)
    yield b"\0" * (2 * BLOCK)


def _config(platform: str, layer: str, name: str) -> bytes:
    os_name, _, arch = platform.partition("/")
    arch, _, variant = arch.partition("/")
    config: dict[str, object] = {
        "architecture": arch, "os": os_name, **({"variant": variant} if variant else {}), "created": CREATED,
        "config": {"Labels": {LABEL: name}},
        "rootfs": {"type": "layers", "diff_ids": [layer]},
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def _entry(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, FIXED_MTIME
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def diff_id(folder: Path) -> str:
    """The digest of the layer :class:`Archive` writes for *folder* (its files read once, nothing written)."""
    digest = hashlib.sha256()
    for chunk in _layer(_members(folder)):
        digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


class Archive:
    """A ``docker save`` archive of *folder*'s image for *platform*, named :func:`ref` (*name*, *key*):
    iterate it for the chunks ``docker load`` reads (once); then :attr:`diff_id` is its layer's digest.

    One pass over the files: the layer comes first, hashed as it goes, and the config that names
    its digest after it (``docker load`` finds the config through ``manifest.json``, last).
    """

    def __init__(self, folder: Path, name: str, key: str, platform: str) -> None:
        self.members = _members(folder)
        self.name, self.key, self.platform = name, key, platform
        self.diff_id = ""

    def __iter__(self) -> Iterator[bytes]:
        size = _layer_size(self.members)
        digest = hashlib.sha256()
        yield _entry("layer.tar", size)
        for chunk in _layer(self.members):
            digest.update(chunk)
            yield chunk
        yield _padding(size)
        self.diff_id = f"sha256:{digest.hexdigest()}"
        config = _config(self.platform, self.diff_id, self.name)
        manifest = json.dumps([{"Config": "config.json", "RepoTags": [ref(self.name, self.key)],
                                "Layers": ["layer.tar"]}]).encode()
        for entry_name, data in (("config.json", config), ("manifest.json", manifest)):
            yield _entry(entry_name, len(data)) + data + _padding(len(data))
        yield b"\0" * (2 * BLOCK)
