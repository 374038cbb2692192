"""The run lease and the ledgers (builder.config.ownership), on real processes and real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.config import ownership
from builder.config.ownership import Ledger, run_state, run_token

CHILD = (
    "import sys, time; from builder.config.ownership import run_token; "
    "print(run_token(), flush=True); time.sleep(60)"
)


@pytest.fixture(autouse=True)
def private_state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _child(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def test_a_killed_run_reads_gone_and_its_lease_is_cleared(tmp_path):
    proc, token = _child(tmp_path)
    try:
        assert run_state(token) == "live"
        lease = Path(token.partition(":")[2])
        assert lease.parent == ownership.runs_dir() and lease.is_file()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert run_state(token) == "gone"
        assert ownership.clear_gone_runs() == [lease]
        assert run_state(token) == "gone"  # absent from this user's runs folder
    finally:
        proc.kill()
        proc.wait()


def test_a_run_that_ends_removes_its_lease(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run([sys.executable, "-c", "from builder.config.ownership import run_token; print(run_token())"],
                         capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert not Path(out.partition(":")[2]).exists()
    assert run_state(out) == "gone"


def test_a_run_is_live_whatever_proc_shows(tmp_path):
    """The lease is a lock, not a PID: a run whose process this one cannot see (another PID
    namespace, hidepid) is live while it holds the lock."""
    proc, token = _child(tmp_path)
    try:
        assert run_state(token) == "live"
        assert str(proc.pid) not in token  # nothing of the PID or the hostname decides
    finally:
        proc.kill()
        proc.wait()


def test_another_machines_or_folders_token_is_never_judged(tmp_path):
    mine = run_token()
    other_machine = "0123456789abcdef:" + mine.partition(":")[2]
    assert run_state(other_machine) == "unknown"
    assert run_state(f"{ownership.machine_id()}:{tmp_path}/elsewhere/x.lock") == "unknown"
    assert run_state("") == run_state("garbage") == "unknown"
    assert run_state(mine) == "live"


def test_a_ledger_keeps_what_a_live_run_or_another_recent_clone_uses(tmp_path):
    ledger = Ledger("images", tmp_path / "images.json")
    proc, token = _child(tmp_path)
    try:
        ledger.record("img", clone="/a")
        with ledger.editing() as records:
            records["img"].runs.append(token)
        assert not ledger.records()["img"].removable("/a", 7)  # the child's run holds it
        proc.kill()
        proc.wait()
        assert ledger.records()["img"].removable("/a", 7)
        ledger.record("img", clone="/b")
        assert not ledger.records()["img"].removable("/a", 7)  # /b used it just now
        assert ledger.records()["img"].removable("/a", 7, now=time.time() + 8 * 86400)
    finally:
        proc.kill()
        proc.wait()


def test_a_damaged_ledger_owns_nothing(tmp_path):
    path = tmp_path / "wheels.json"
    path.write_text("{not json")
    assert Ledger("wheels", path).records() == {}
    path.write_text(json.dumps({"records": {"a": {"clones": "x"}, "b": {"recorded": 1}}}))
    assert list(Ledger("wheels", path).records()) == ["b"]
