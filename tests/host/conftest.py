"""Fixtures for the host tests: kernel-shaped sysfs and /dev trees, a tiny project, the engine.

The sysfs and /dev trees are laid out the way the kernel lays them out, because the CI
machines have no GPUs: ``bus/pci/devices/<addr>`` is a symlink into ``devices/pci0000:00/...``
holding ``vendor``, ``device`` and ``class`` files with the kernel's ``0x....\\n`` format.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from docker.errors import DockerException, NotFound

from builder.launch import RUN_LABEL
from builder.project import Project, load_project

MAIN = Path(__file__).resolve().parents[2]
TEST_LABEL = "io.ml-image-builder.test"

# (address, vendor, device, class) as the kernel prints them.
H200 = ("0000:19:00.0", "0x10de", "0x2335", "0x030200")
MI300X = ("0000:0c:00.0", "0x1002", "0x74a1", "0x120000")
RADEON = ("0000:03:00.0", "0x1002", "0x744c", "0x030000")  # RX 7900 XTX, a VGA-class consumer card
MAX1550 = ("0000:29:00.0", "0x8086", "0x0bd5", "0x038000")  # Intel Data Center GPU Max
IGPU = ("0000:00:02.0", "0x8086", "0xa780", "0x030000")  # Intel UHD 770 on the CPU
HOST_BRIDGE = ("0000:00:00.0", "0x8086", "0x0d57", "0x060000")
USB = ("0000:00:14.0", "0x8086", "0x7ae0", "0x0c0330")
ROOT_PORT = ("0000:00:01.0", "0x8086", "0x0d58", "0x060400")


def make_sysfs(root: Path, *devices: tuple[str, str, str, str]) -> Path:
    """A sysfs tree under *root*: devices off bus 00 sit behind root port 0000:00:01.0, as on real hosts."""
    (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
    for address, vendor, device, pci_class in devices:
        bus = address.split(":")[1]
        parts = ["pci0000:00"] + ([] if bus == "00" else ["0000:00:01.0"]) + [address]
        real = root / "devices" / Path(*parts)
        real.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", pci_class)):
            (real / name).write_text(value + "\n")
        (real / "driver_override").write_text("(null)\n")
        # The kernel's link is relative: bus/pci/devices/X -> ../../../devices/pci0000:00/.../X
        os.symlink(Path("..", "..", "..", "devices", *parts), root / "bus" / "pci" / "devices" / address)
    return root


def make_dev(root: Path, *nodes: str, gid: int | None = None) -> Path:
    """A /dev tree with the named nodes (``nvidia0``, ``kfd``, ``dri/renderD128``) as plain files.

    Plain files stand in for character devices (mknod needs privileges the CI may lack);
    *gid* sets their owning group like the host's ``render`` group would.
    """
    root.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        path = root / node
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        path.chmod(0o660)
        if gid is not None:
            os.chown(path, -1, gid)
    return root


@pytest.fixture
def project_dir(tmp_path: Path) -> Path:
    """A copy of the project's matrix and wheel mapping with a registry no one else uses."""
    folder = tmp_path / "project"
    folder.mkdir()
    text = (MAIN / "matrix.yaml").read_text()
    registry = f"localhost:5999/builder-hosttest-{uuid.uuid4().hex[:10]}"
    (folder / "matrix.yaml").write_text(text.replace("registry: localhost:5000/ml-runtime", f"registry: {registry}", 1))
    shutil.copy(MAIN / "wheel-mapping.json", folder / "wheel-mapping.json")
    return folder


@pytest.fixture
def project(project_dir: Path) -> Project:
    return load_project(project_dir / "matrix.yaml", allow_unpinned=True)


@pytest.fixture(scope="session")
def engine() -> Iterator[docker.DockerClient]:
    """A client whose engine answered; fails under CI (env CI set), skips elsewhere."""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except DockerException as exc:
        message = f"no Docker engine answers ({exc})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run the engine tests")
        pytest.skip(message)
    yield client
    client.close()


def busybox_binary() -> Path:
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        if Path(candidate).is_file():
            return Path(candidate)
    message = "no static busybox (apt-get install busybox-static)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


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
    engine.images.build(path=str(context), tag=ref, rm=True, forcerm=True, labels={TEST_LABEL: "host"})
    try:
        yield ref
    finally:
        for container in engine.containers.list(all=True, filters={"label": f"{RUN_LABEL}.image={ref}"}):
            container.remove(force=True)
        try:
            engine.images.remove(ref, force=True)
        except NotFound:
            pass
