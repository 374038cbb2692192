"""The user's state folder: caches (the wheelhouse), the local registry's data, the run leases and
ledgers (:mod:`builder.config.ownership`), outside the repo."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """Where builder keeps caches and the local registry's data (outside the repo)."""
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "ml-image-builder"
