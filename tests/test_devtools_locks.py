"""devtools/locks.py reads the hash locks as ``builder lock`` writes them (builder/wheels/lockfile.py):
bench takes the wheels of a target from there, not from builder's internals."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.wheels import lockfile
from devtools import locks
from devtools.support import REPO


def test_reads_what_builder_writes(tmp_path: Path):
    pins = [lockfile.Pin("torch", "2.9.0+cpu", "ab" * 32, "torch-2.9.0+cpu-cp311-cp311-linux_x86_64.whl",
                         "https://download.pytorch.org/whl/cpu"),
            lockfile.Pin("Annotated_Types", "0.8.0", "cd" * 32, "annotated_types-0.8.0-py3-none-any.whl")]
    path = tmp_path / "requirements.amd64.lock"
    lockfile.write_lock(path, "a test", "sha256:01", pins)
    assert locks.read(path) == [locks.Pin(p.name, p.version, p.sha256, p.filename) for p in lockfile.ordered(pins)]
    assert locks.read(path)[0].requirement() == lockfile.ordered(pins)[0].line().split("  # ")[0]


def test_the_committed_locks_read_as_builder_reads_them():
    paths = sorted((REPO / "images").rglob("*.lock"))
    assert paths
    for path in paths:
        ours = [(p.name, p.version, p.sha256, p.filename) for p in locks.read(path)]
        assert ours == [(p.name, p.version, p.sha256, p.filename) for p in lockfile.read_lock(path)[1]], path


def test_a_line_that_is_no_pin_raises(tmp_path: Path):
    (tmp_path / "x.lock").write_text("# header\ntorch>=2\n")
    with pytest.raises(ValueError, match="torch>=2"):
        locks.read(tmp_path / "x.lock")


def test_a_missing_lock_has_no_pins(tmp_path: Path):
    assert locks.read(tmp_path / "none.lock") == []
    assert locks.shared_lock(tmp_path, "tools", "linux/amd64") == tmp_path / "images" / "tools.amd64.lock"
