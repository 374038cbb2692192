"""Small file helpers: atomic writes so an error never leaves a half-written file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, text: str) -> None:
    """Write *text* to *path* through a temporary file in the same folder and a rename.

    Example:
        >>> atomic_write(Path("images/cpu/Dockerfile"), "FROM scratch\\n")
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def published_path(root: Path) -> Path:
    """``dist/published.json`` of the project at *root*: the digests ``builder build --push`` published.

    Example:
        >>> published_path(Path("/src/project"))
        PosixPath('/src/project/dist/published.json')
    """
    return root / "dist" / "published.json"
