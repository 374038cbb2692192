"""The architecture holds: the layer contracts (import-linter, pyproject.toml) and mypy on builder/, bench/,
devtools/, runtime/ and tests/ (whose stand-ins are checked against the Protocols they stand in for).

Both also run in ``make check``; here they run with the rest of the unit tests.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from devtools.support import REPO

BIN = Path(sys.executable).parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False, timeout=600)


def test_import_contracts_are_kept():
    """cli > supply > images | cluster > gc > wheels | base > host > oci > config; only cli imports click; ml_runtime imports
    nothing of builder."""
    proc = _run(str(BIN / "lint-imports"), "--no-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_clean_on_the_code_and_the_tests():
    """What ``make check`` runs: mypy on pyproject.toml's [tool.mypy] files."""
    files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert set(files) == {"builder", "bench", "devtools", "runtime/ml_runtime", "tests"}
    proc = _run(sys.executable, "-m", "mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
