"""build_all's scheduling and publish.record's locking, without an engine."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from pathlib import Path
from unittest import mock

import pytest
from helpers import bare_build_project, fake_target

from builder.images import build, publish
from builder.images.outcome import Outcome


@pytest.fixture
def slow_writes(monkeypatch):
    """Widen record()'s read-change-write window: a lost update becomes near certain without a lock."""
    write = publish.atomic_write

    def slow(path: Path, text: str) -> None:
        time.sleep(0.02)
        write(path, text)

    monkeypatch.setattr(publish, "atomic_write", slow)


def _record(root: Path, name: str) -> None:
    publish.record(root, [{"target": name, "digest": "sha256:" + name}])


def test_record_keeps_every_thread_s_record(tmp_path, slow_writes):
    names = [f"t{i}" for i in range(12)]
    threads = [threading.Thread(target=_record, args=(tmp_path, n)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(json.loads((tmp_path / "dist/published.json").read_text())) == sorted(names)


def test_record_keeps_every_process_s_record(tmp_path, slow_writes):
    fork = multiprocessing.get_context("fork")  # the children keep the slow writes
    names = [f"p{i}" for i in range(8)]
    procs = [fork.Process(target=_record, args=(tmp_path, n)) for n in names]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    assert sorted(json.loads((tmp_path / "dist/published.json").read_text())) == sorted(names)


def _build_all(monkeypatch, tmp_path: Path, *, jobs: int, keep_going: bool,
               raises: BaseException | None = None) -> tuple[list[str], list[Outcome]]:
    """build_all over six fake targets: t0 fails after 0.1 s (or raises *raises*), the others take 0.3 s each."""
    started: list[str] = []

    def process(client, project, target, ui, **kwargs) -> Outcome:
        started.append(target.name)
        time.sleep(0.1 if target.name == "t0" else 0.3)
        if raises is not None and target.name == "t0":
            raise raises
        return Outcome(target.name, error="boom" if target.name == "t0" else None)

    monkeypatch.setattr(build, "process", process)
    monkeypatch.setattr(build, "docker_build", lambda *a, **k: ("sha256:common", 0, 0))
    project = bare_build_project(monkeypatch, tmp_path)
    targets = [fake_target(f"t{i}", dockerfile=f"images/t{i}/Dockerfile") for i in range(6)]
    outcomes = build.build_all(mock.MagicMock(), project, targets, mock.MagicMock(), jobs=jobs,
                               keep_going=keep_going)
    return started, outcomes


@pytest.mark.parametrize("jobs", [1, 3])
def test_without_keep_going_no_target_starts_after_a_failure(monkeypatch, tmp_path, jobs):
    started, outcomes = _build_all(monkeypatch, tmp_path, jobs=jobs, keep_going=False)
    # t0 fails first; with -j 3, t1 and t2 had started beside it and finish; nothing else starts.
    running = [f"t{i}" for i in range(jobs)]
    assert sorted(started) == running
    assert [o.target for o in outcomes] == running and outcomes[0].error == "boom"


@pytest.mark.parametrize("jobs", [1, 3])
def test_keep_going_runs_every_target(monkeypatch, tmp_path, jobs):
    started, outcomes = _build_all(monkeypatch, tmp_path, jobs=jobs, keep_going=True)
    assert sorted(started) == [f"t{i}" for i in range(6)]
    assert [o.target for o in outcomes] == [f"t{i}" for i in range(6)]


@pytest.mark.parametrize("keep_going", [False, True])
def test_a_foreign_platform_without_emulation_fails_with_the_fix(monkeypatch, tmp_path, keep_going):
    """The emulation check runs before any wheel is fetched; the native targets build only with -k."""
    built: list[str] = []
    monkeypatch.setattr(build, "process", lambda client, project, target, ui, **kw: built.append(target.unit)
                        or Outcome(target.name, target.platform))
    project = bare_build_project(monkeypatch, tmp_path)
    monkeypatch.setattr(build.platforms, "emulation_problem",  # stands in for a host without qemu's handler
                        lambda platform: None if platform == "linux/native" else f"{platform} needs emulation: FIX")
    native = fake_target("native", dockerfile="images/native/Dockerfile", platform="linux/native")
    foreign = fake_target("foreign", dockerfile="images/foreign/Dockerfile", platform="linux/other")
    outcomes = build.build_all(mock.MagicMock(), project, [foreign, native], mock.MagicMock(), keep_going=keep_going)
    failed = next(o for o in outcomes if o.target == "foreign")
    assert failed.error == "linux/other needs emulation: FIX" and failed.platform == "linux/other"
    assert built == (["native"] if keep_going else [])


@pytest.mark.parametrize("jobs", [1, 3])
def test_an_exception_in_one_build_is_its_outcome_and_the_others_finish(monkeypatch, tmp_path, jobs):
    """The engine's transport error in one build (-j N: re-raised from f.result()) is one line in its outcome."""
    import requests.exceptions

    _started, outcomes = _build_all(monkeypatch, tmp_path, jobs=jobs, keep_going=True,
                                    raises=requests.exceptions.ReadTimeout("read timed out"))
    assert [o.target for o in outcomes] == [f"t{i}" for i in range(6)]
    assert "Docker engine at" in (outcomes[0].error or "") and "ReadTimeout" in (outcomes[0].error or "")
    assert all(o.error is None for o in outcomes[1:])
