"""Where two layers differ: the first path whose entry is not the same, and in what.

A layer is a tar stream, compressed with zstd or gzip or not at all (the containerd store and a
registry keep it as built; the classic store and podman uncompressed). Each member is reduced to an
:class:`Entry` (type, mode, owner, time, link target, size, content digest, extended attributes),
so a difference is named by the attribute that differs, never by a format detail (GNU or POSIX
headers, the compression).

Example:
    >>> import io, tempfile
    >>> def layer(text):
    ...     path = Path(tempfile.mkdtemp()) / "layer.tar"
    ...     with tarfile.open(path, mode="w") as tar:
    ...         data = text.encode(); info = tarfile.TarInfo("opt/app/cli.py"); info.size = len(data)
    ...         tar.addfile(info, io.BytesIO(data))
    ...     return path
    >>> first_difference(entries(layer("a")), entries(layer("b")))
    ('opt/app/cli.py', 'content')
"""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import tarfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO

from builder.oci.secrets import PLAIN, child_env

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Entry:
    """One member of a layer, as far as its bytes in a container's file system go."""

    type: str
    mode: int
    owner: str
    mtime: int
    link: str
    size: int
    content: str
    xattrs: str


def _digest(handle: IO[bytes] | None) -> str:
    if handle is None:
        return ""
    h = hashlib.sha256()
    for chunk in iter(lambda: handle.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def _entries_of(stream: IO[bytes]) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            name = m.name.removeprefix("./").rstrip("/") or "."
            xattrs = ";".join(f"{k}={v}" for k, v in sorted(m.pax_headers.items()) if k.startswith("SCHILY.xattr."))
            out[name] = Entry(m.type.decode(errors="replace"), m.mode, f"{m.uid}:{m.gid}", int(m.mtime),
                              m.linkname, m.size if m.isreg() else 0,
                              _digest(tar.extractfile(m)) if m.isreg() else "", xattrs)
    return out


def entries(layer: Path) -> dict[str, Entry]:
    """Every member of the layer in the file *layer* (compressed or not), in the layer's order."""
    with layer.open("rb") as blob:
        magic = blob.read(4)
    with layer.open("rb") as blob:
        if magic.startswith(GZIP_MAGIC):
            with gzip.GzipFile(fileobj=blob) as plain:
                return _entries_of(plain)  # type: ignore[arg-type]
        if magic != ZSTD_MAGIC:
            return _entries_of(blob)
        # Python 3.11 has no zstd of its own: the zstd tool the host has for recompressing (make host)
        with subprocess.Popen(["zstd", "-dcq"], stdin=blob, stdout=subprocess.PIPE, env=child_env(PLAIN)) as proc:
            assert proc.stdout is not None
            found = _entries_of(proc.stdout)
            proc.stdout.read()
        return found


def first_difference(published: dict[str, Entry], rebuilt: dict[str, Entry]) -> tuple[str, str] | None:
    """(path, what differs) of the first member, in the published layer's order, that the two layers
    do not hold alike; None when they hold the same members with the same attributes.
    """
    for path, ours in published.items():
        theirs = rebuilt.get(path)
        if theirs is None:
            return path, "only in the published layer"
        if ours != theirs:
            return path, ", ".join(f.name for f in fields(Entry) if getattr(ours, f.name) != getattr(theirs, f.name))
    for path in rebuilt:
        if path not in published:
            return path, "only in the rebuilt layer"
    for (a, _), (b, _) in zip(published.items(), rebuilt.items(), strict=True):
        if a != b:
            return a, "the same members in another order"
    return None
