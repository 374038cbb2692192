"""The Slurm cluster fixture: real daemons (slurmcluster.py), started once per module, stopped after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster.slurmcluster import SLURM_LABEL, SlurmCluster, missing_tools

from devtools.support import fail_or_skip


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory, engine) -> Iterator[SlurmCluster]:
    """munged + slurmctld + slurmd n1 and n2 on loopback; every job's containers are gone afterwards."""
    missing = missing_tools()
    if missing:
        fail_or_skip(f"no {', '.join(missing)} (apt-get install slurm-wlm munge; scripts/setup-host.sh does)")
    before = {c.id for c in engine.client.containers.list(all=True, filters={"label": SLURM_LABEL})}
    # A short path: slurmd's spool and munge's socket live under it.
    cluster = SlurmCluster.start(Path(tmp_path_factory.mktemp("slurm")))
    try:
        yield cluster
    finally:
        cluster.stop()
        for container in engine.client.containers.list(all=True, filters={"label": SLURM_LABEL}):
            if container.id not in before:
                container.remove(force=True)


@pytest.fixture
def cluster_project(tmp_path: Path):
    """The repository's matrix and wheel mapping in a folder of their own (no dist/published.json yet)."""
    import shutil

    from builder.config.project import load_project
    from devtools.support import REPO

    folder = tmp_path / "project"
    folder.mkdir()
    for name in ("matrix.yaml", "wheel-mapping.json"):
        shutil.copy(REPO / name, folder / name)
    return load_project(folder / "matrix.yaml", allow_unpinned=True)
