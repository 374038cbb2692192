"""Helpers shared by the tests (import as `from helpers import ...`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

# One definition of "a private copy of the project", shared with the benchmark.
from bench import REPO, copy_project, free_port  # noqa: F401


def edit_matrix(root: Path, **changes: object) -> dict:
    """Rewrite keys of root/matrix.yaml; return the new document."""
    path = root / "matrix.yaml"
    doc = yaml.safe_load(path.read_text())
    doc.update(changes)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc


def run_builder(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 1800):
    """Run the real CLI in a subprocess (exit codes and stderr exactly as a user sees them)."""
    return subprocess.run(
        [sys.executable, "-m", "builder", *args], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, **(env or {})}, timeout=timeout, check=False,
    )
