"""Which engine: BUILDER_ENGINE (or --engine) names one; a name that is no engine is one line, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import run_builder

from builder.config.errors import UserError
from builder.oci.connect import connect, engine_kind


def test_an_unknown_engine_is_one_line_and_exit_2(project: Path) -> None:
    proc = run_builder("doctor", cwd=project, env={"BUILDER_ENGINE": "rocket"})
    assert "BUILDER_ENGINE='rocket' names no engine; use one of: docker, podman" in proc.stdout + proc.stderr
    proc = run_builder("build", "-t", "cpu", "--no-smoke", cwd=project, env={"BUILDER_ENGINE": "rocket"})
    assert proc.returncode == 2, proc.stderr
    line = "error: BUILDER_ENGINE='rocket' names no engine; use one of: docker, podman"
    assert proc.stderr.strip().splitlines() == [line], proc.stderr


def test_the_engine_option_refuses_what_is_no_engine(project: Path) -> None:
    proc = run_builder("build", "--engine", "rocket", cwd=project)
    assert proc.returncode == 2 and "'rocket' is not one of 'docker', 'podman'" in proc.stderr


def test_a_docker_host_that_is_set_means_docker_even_with_podman_installed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A DOCKER_HOST that does not answer is said, never replaced by podman behind the user's back: a
    stand-in ``podman`` on PATH that records being called (only to show it is not asked)."""
    called = tmp_path / "called"
    fake = tmp_path / "bin" / "podman"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ntouch {called}\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/no-such-docker.sock")
    monkeypatch.delenv("BUILDER_ENGINE", raising=False)
    with pytest.raises(UserError, match="no Docker engine answers at unix:///tmp/no-such-docker.sock"):
        connect(timeout=5)
    assert not called.exists(), "podman was tried although DOCKER_HOST names the engine"


def test_engine_kind_is_the_engine_connect_would_give(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``builder run`` plans for the engine by name before it connects: the chosen one as it is; with a
    DOCKER_HOST set, Docker without asking it (a DOCKER_HOST that does not answer still means Docker, as
    :func:`connect` has it) even with a ``podman`` on PATH."""
    fake = tmp_path / "bin" / "podman"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/no-such-docker.sock")
    monkeypatch.setenv("BUILDER_ENGINE", "podman")
    assert engine_kind() == "podman"
    monkeypatch.delenv("BUILDER_ENGINE")
    assert engine_kind(timeout=5) == "docker"


def test_builder_run_connects_to_the_engine_it_planned_for(monkeypatch: pytest.MonkeyPatch, project: Path) -> None:
    """A plan made for podman runs on podman, never on whichever engine answers first: here (no podman on PATH)
    it says podman is missing, although Docker may answer."""
    from builder.config.project import load_project
    from builder.host import hardware, launch
    from builder.host.runspec import run_spec

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("BUILDER_ENGINE", raising=False)
    plan = run_spec(load_project(project / "matrix.yaml", allow_unpinned=True), ["true"], target="cpu",
                    host=hardware.HostGpus(), environ={}, cwd=project, engine="podman")
    with pytest.raises(UserError, match="podman is not installed"):
        launch.launch(plan, say=lambda line: None)
