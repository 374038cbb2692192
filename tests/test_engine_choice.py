"""Which engine: BUILDER_ENGINE (or --engine) names one; a name that is no engine is one line, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import run_builder

from builder.config.errors import UserError
from builder.oci.engine import connect


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
