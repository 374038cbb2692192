"""Where the image build leaves its records: torch's build facts and the validated default spec.

Both are written once at image build into ``<venv>/share/ml-runtime/`` and read at every start
instead of importing torch, pydantic and PyYAML. ``$RUNTIME_RECORD_DIR`` names another folder: a
host install that recorded its own, as ``make gpu-check`` does. Cheap to import (every start does).

Example:
    >>> record_file("torch-facts.json", {"RUNTIME_RECORD_DIR": "/tmp/records"})
    PosixPath('/tmp/records/torch-facts.json')
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

#: The image's records, in the virtual environment the runtime is installed in.
RECORD_DIR = Path(sys.prefix) / "share" / "ml-runtime"

RECORD_DIR_ENV = "RUNTIME_RECORD_DIR"


def record_file(name: str, environ: Mapping[str, str] | None = None) -> Path:
    """The record ``name`` in ``$RUNTIME_RECORD_DIR``, else in :data:`RECORD_DIR`.

    Example:
        >>> record_file("default-spec.json", {}).parent == RECORD_DIR
        True
    """
    env = os.environ if environ is None else environ
    return Path(env.get(RECORD_DIR_ENV) or RECORD_DIR) / name
