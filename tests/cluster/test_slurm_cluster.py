"""``builder slurm`` on a real Slurm cluster (slurmctld + two slurmd on this host, munge): the cpu
image trains on 2 nodes over gloo, a training that fails fails the job, scancel stops the containers.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from cluster.slurmcluster import SLURM_LABEL, SlurmCluster
from helpers import run_builder

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.heavy]  # a cluster of its own: make test-heavy
FINAL = re.compile(r"^(\d+): FINAL first_loss=([0-9.]+) last_loss=([0-9.]+)", re.MULTILINE)


def submit(cluster: SlurmCluster, project: Path, folder: Path, *args: str, wait: bool = True):
    folder.mkdir(parents=True, exist_ok=True)
    flags = ["--submit", "--wait"] if wait else ["--submit"]
    return run_builder("slurm", "-t", "cpu", "--nodes", "2", "--script", str(folder),
                       "--output", f"{folder}/%x-%j.out", *flags, "--", *args,
                       cwd=project, env=cluster.env, timeout=600)


def job_log(folder: Path) -> str:
    logs = list(folder.glob("*.out"))
    assert len(logs) == 1, logs
    return logs[0].read_text()


def test_two_nodes_train_over_gloo_and_converge(slurm_cluster, cpu_project: Path, tmp_path: Path, engine,
                                                no_leftovers) -> None:
    result = submit(slurm_cluster, cpu_project, tmp_path / "ok", "/opt/examples/train.py", "--epochs", "15")
    log = job_log(tmp_path / "ok")
    assert result.returncode == 0, result.stderr + log + slurm_cluster.logs()
    script = (tmp_path / "ok" / "cpu-train.sbatch").read_text()
    assert "ml-runtime@sha256:" in script  # the published image, by digest
    assert re.search(r"rendezvous 127\.0\.0\.1:\d+: 2 process\(es\) on 2 node\(s\)", log), log
    finals = {int(rank): (float(first), float(last)) for rank, first, last in FINAL.findall(log)}
    assert sorted(finals) == [0, 1], log  # srun --label: both ranks (one per node) report
    assert all(last < first for first, last in finals.values()), finals
    assert "processes=2 backend=gloo" in log
    assert not engine.client.containers.list(all=True, filters={"label": SLURM_LABEL})


def test_a_failing_training_fails_the_job(slurm_cluster, cpu_project: Path, tmp_path: Path, no_leftovers) -> None:
    # The data file is missing: train.py fails on both ranks, the launcher exits 1, and so does the job.
    result = submit(slurm_cluster, cpu_project, tmp_path / "fail", "/opt/examples/train.py", "--epochs", "2",
                    "--data", "/workspace/no-such-file.csv")
    log = job_log(tmp_path / "fail")
    assert result.returncode == 1, result.stderr + log
    assert "No such file or directory: '/workspace/no-such-file.csv'" in log
    assert not FINAL.findall(log), log


def test_scancel_stops_and_removes_the_containers(slurm_cluster, cpu_project: Path, tmp_path: Path, engine,
                                                 no_leftovers) -> None:
    result = submit(slurm_cluster, cpu_project, tmp_path / "cancel", "/opt/examples/train.py", "--epochs",
                    "1000000", wait=False)
    assert result.returncode == 0, result.stderr
    job = re.search(r"Submitted batch job (\d+)", result.stdout + result.stderr)
    assert job, result.stdout + result.stderr
    mine = {"label": f"{SLURM_LABEL}={job[1]}"}
    deadline = time.monotonic() + 180
    while len(engine.client.containers.list(filters=mine)) < 2:
        assert time.monotonic() < deadline, slurm_cluster.logs()
        time.sleep(1)
    cancelled = time.monotonic()
    assert slurm_cluster.run("scancel", job[1]).returncode == 0
    while slurm_cluster.run("squeue", "-h", "-j", job[1]).stdout.strip():
        assert time.monotonic() - cancelled < 60, "the job outlived scancel by a minute"
        time.sleep(1)
    assert not engine.client.containers.list(all=True, filters=mine)
    state = slurm_cluster.run("scontrol", "show", "job", job[1]).stdout
    assert "JobState=CANCELLED" in state, state
    # The containers stopped on SIGTERM, well within docker stop's grace (20 s) and Slurm's KillWait (30 s).
    assert time.monotonic() - cancelled < 30
