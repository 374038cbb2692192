"""What a killed run leaves, found and removed by the next one without an engine: smoke containers
of ended runs (a fake engine's listing: the engine test is tests/engine/test_state_engine.py),
temporary files of atomic writes, a damaged dist/published.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from doubles import NoEngine

from builder.config import files
from builder.config.ownership import run_token
from builder.images import execute, publish
from builder.images.smoke import SMOKE_LABEL


def _ended_run() -> str:
    """The lease of a run that has ended since (builder.config.ownership.run_token)."""
    proc = subprocess.run([sys.executable, "-c", "from builder.config.ownership import run_token; print(run_token())"],
                          capture_output=True, text=True, check=True)
    return proc.stdout.strip()


class Containers(NoEngine):
    """A stand-in engine's container listing (the engine tests run the real one:
    tests/engine/test_state_engine.py, a killed run's container in another PID namespace)."""

    def __init__(self, labels: dict[str, dict[str, str]]) -> None:
        self.labels_of = labels
        self.removed: list[str] = []

    def container_labels(self, label: str) -> dict[str, dict[str, str]]:
        return {cid: labels for cid, labels in self.labels_of.items() if label in labels}

    def remove_container(self, container: str) -> None:
        self.removed.append(container)


def test_the_next_run_removes_the_smoke_containers_of_ended_runs_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    live = run_token()
    elsewhere = "0123456789abcdef:" + live.partition(":")[2]  # another machine's run: never judged
    engine = Containers({"dead" * 4: {SMOKE_LABEL: _ended_run()}, "live" * 4: {SMOKE_LABEL: live},
                         "else" * 4: {SMOKE_LABEL: elsewhere}, "old" * 4: {SMOKE_LABEL: "1"},
                         "mine" * 4: {"other": "x"}})
    said: list[str] = []
    assert execute.remove_orphans(engine, said.append) == ["dead" * 4] == engine.removed
    assert said == [f"removed 1 smoke container(s) a killed run left: {'dead' * 3}"]
    engine = Containers({"live" * 4: {SMOKE_LABEL: live}})
    assert execute.remove_orphans(engine, said.append) == [] and len(said) == 1  # nothing to say


def test_stale_temporary_files_of_atomic_writes_are_removed(tmp_path):
    files.atomic_write(tmp_path / "images" / "cpu" / "requirements.amd64.lock", "x\n")
    old, fresh = tmp_path / "images" / "cpu" / ".requirements.amd64.lock.ab12cd_3.tmp", tmp_path / ".base.lock.json.zz99yy88.tmp"
    kept = [fresh, tmp_path / "images" / ".notes.tmp", tmp_path / "images" / "cpu" / "requirements.amd64.lock"]
    for path in (old, *kept):
        path.write_text("half")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    os.utime(kept[1], (time.time() - 3600, time.time() - 3600))
    assert files.remove_stale_temporaries(tmp_path / "images", recursive=True) == [old]
    assert files.remove_stale_temporaries(tmp_path) == []  # fresh: maybe another run's write under way
    assert all(p.exists() for p in kept)


def test_a_damaged_published_json_is_rewritten(tmp_path):
    path = files.published_path(tmp_path)
    path.parent.mkdir()
    path.write_text('{"cpu": {"target": "cp')
    publish.record(tmp_path, [{"target": "cpu", "digest": "sha256:d"}])
    assert json.loads(path.read_text()) == {"cpu": {"target": "cpu", "digest": "sha256:d"}}


def test_two_runs_starting_the_local_registry_at_once_both_get_it(tmp_path):
    """Two ``--push`` builds at once, no registry answering: one starts it, the other waits and finds it
    (on main the second's docker-registry could not bind the port and that run failed)."""
    import shutil
    import signal

    from devtools.support import free_port

    if shutil.which("docker-registry") is None:
        from devtools.support import fail_or_skip
        fail_or_skip("docker-registry is not installed (make host installs it)")
    host = f"127.0.0.1:{free_port()}"
    code = f"from builder.oci.localregistry import ensure_local; print(ensure_local({host!r}))"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    pid = tmp_path / "ml-image-builder" / f"registry-{host.rsplit(':', 1)[1]}" / "registry.pid"
    try:
        assert [p.returncode for p in procs] == [0, 0, 0], [err[-500:] for _, err in outs]
        assert sum(out.startswith("started") for out, _ in outs) == 1, outs
    finally:
        if pid.exists():
            os.kill(int(pid.read_text()), signal.SIGTERM)


def test_a_lock_taken_again_by_the_thread_that_holds_it_does_not_wait_for_itself(tmp_path):
    """builder gc removes staged folders under the wheelhouse lock through functions that take it too:
    a second flock on a new descriptor would wait for this very process forever."""
    import threading

    from builder.config.files import locked

    done = threading.Event()

    def nested():
        with locked(tmp_path / ".lock"), locked(tmp_path / ".lock"):
            done.set()

    worker = threading.Thread(target=nested, daemon=True)
    worker.start()
    worker.join(10)
    assert done.is_set(), "a nested lock on the same file waited for itself"


def test_a_run_waiting_for_a_lock_another_process_holds_says_so_until_it_has_it(tmp_path, monkeypatch):
    """A second build that waits on the wheelhouse lock is not silent: its *waiting* hears of it at
    once and every WAITING_EVERY_S (here 0.5 s), then it gets the lock when the holder lets go."""
    lock = tmp_path / "wheelhouse.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time\n"
        f"handle = open({str(lock)!r}, 'a'); fcntl.flock(handle, fcntl.LOCK_EX)\n"
        "print('held', flush=True); time.sleep(1.6)")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    monkeypatch.setattr(files, "WAITING_EVERY_S", 0.5)
    heard: list[int] = []
    started = time.monotonic()
    with files.locked(lock, waiting=heard.append):
        waited = time.monotonic() - started
    holder.wait(timeout=10)
    assert waited >= 1.0, "it took the lock while another process held it"
    assert len(heard) >= 2 and heard[0] == 0 and heard == sorted(heard), heard
    heard.clear()
    with files.locked(lock, waiting=heard.append):  # free: nothing to say
        pass
    assert heard == []


def test_the_suite_forgets_the_builders_records_of_the_engines_and_registries_it_removed(tmp_path, monkeypatch):
    """What tests/conftest.py does when the session ends: the builder's ledgers of an engine the session
    started and removed go (another engine's stay), and so does a registry folder made since the
    session began that holds only its lock (one that holds a registry, or existed before, or whose
    lock a run holds, stays)."""
    import fcntl

    from helpers import _DockerAt, forget_engines, registry_folders, remove_lock_only_folders

    from builder.gc import owned

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    gone, kept = "unix:///tmp/mlb-x-1/docker.sock", "unix:///var/run/docker.sock"
    for host in (gone, kept):
        owned.images_ledger(_DockerAt(host)).record("sha256:aa")  # type: ignore[arg-type]
        owned.build_cache_ledger(_DockerAt(host)).record("record-id")  # type: ignore[arg-type]
    (state := tmp_path / "ml-image-builder").joinpath("registry-1000").mkdir(parents=True)
    (state / "registry-1000" / ".lock").touch()
    before = registry_folders()
    for port in ("2000", "3000", "4000"):
        (state / f"registry-{port}").mkdir()
        (state / f"registry-{port}" / ".lock").touch()
    (state / "registry-3000" / "config.yml").write_text("version: 0.1\n")

    forget_engines([gone])
    with open(state / "registry-4000" / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        removed = remove_lock_only_folders(before)

    ledgers = sorted(p.name for p in (state / "owned").iterdir())
    key = owned.engine_key(_DockerAt(kept))  # type: ignore[arg-type]
    assert ledgers == sorted([f"images-{key}.json", f".images-{key}.json.lock",
                              f"build-cache-{key}.json", f".build-cache-{key}.json.lock"]), ledgers
    assert removed == [state / "registry-2000"]
    assert sorted(p.name for p in state.glob("registry-*")) == ["registry-1000", "registry-3000", "registry-4000"]
