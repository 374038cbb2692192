"""Fixtures for the host tests: a tiny project, a busybox image tagged like a target (the engine: tests/conftest.py).

Sysfs and /dev layouts live in hostlayouts.py.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from docker.errors import NotFound

from builder.config.project import Project, load_project
from builder.host.runspec import RUN_LABEL
from devtools.support import REPO, fail_or_skip

TEST_LABEL = "io.ml-image-builder.test"


@pytest.fixture
def project_dir(tmp_path: Path) -> Path:
    """A copy of the project's matrix and wheel mapping with a registry no one else uses."""
    folder = tmp_path / "project"
    folder.mkdir()
    text = (REPO / "matrix.yaml").read_text()
    registry = f"localhost:5999/builder-hosttest-{uuid.uuid4().hex[:10]}"
    (folder / "matrix.yaml").write_text(
        text.replace("registry: localhost:5000/ml-runtime", f"registry: {registry}", 1)
    )
    shutil.copy(REPO / "wheel-mapping.json", folder / "wheel-mapping.json")
    return folder


@pytest.fixture
def project(project_dir: Path) -> Project:
    return load_project(project_dir / "matrix.yaml", allow_unpinned=True)


def busybox_binary() -> Path:
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        if Path(candidate).is_file():
            return Path(candidate)
    fail_or_skip("no static busybox (apt-get install busybox-static)")


@pytest.fixture
def image(engine: docker.DockerClient, project: Project, tmp_path: Path) -> Iterator[str]:
    """The cpu target's tag on a 2 MB image: FROM scratch + static busybox, user 1001 like the real images."""
    context = tmp_path / "image"
    context.mkdir()
    shutil.copy(busybox_binary(), context / "busybox")
    (context / "Dockerfile").write_text(
        "FROM scratch\nCOPY busybox /bin/busybox\nUSER 1001:1001\nWORKDIR /workspace\n"
        # The real images' ENTRYPOINT is the contract checker; here busybox runs the command.
        'ENTRYPOINT ["/bin/busybox"]\nCMD ["true"]\n'
    )
    ref = project.target("cpu").primary_ref
    engine.client.images.build(path=str(context), tag=ref, rm=True, forcerm=True, labels={TEST_LABEL: "host"})
    try:
        yield ref
    finally:
        for container in engine.client.containers.list(all=True, filters={"label": f"{RUN_LABEL}.image={ref}"}):
            container.remove(force=True)
        try:
            engine.client.images.remove(ref, force=True)
        except NotFound:
            pass
