"""Helpers shared by the tests (import as `from helpers import ...`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PROJECT_FILES = ["matrix.yaml", "wheel-mapping.json", "base.lock.json", ".dockerignore", ".hadolint.yaml"]
PROJECT_DIRS = ["templates", "runtime", "examples", "images"]

def copy_project(dest: Path) -> Path:
    """A private copy of the project (matrix, mapping, templates, runtime, examples, images)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        if (REPO / name).exists():
            shutil.copy2(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in PROJECT_DIRS:
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    return dest


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
