"""Which engine: BUILDER_ENGINE (or --engine) names one; a name that is no engine is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

from helpers import run_builder


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
