"""GPU detection from sysfs and /dev.

We lack the hardware, so the sysfs and /dev trees here are built in tmp_path laid out as
the kernel lays them out (``bus/pci/devices/<addr>`` symlinks into ``devices/pci0000:00/...``,
``vendor``/``device``/``class`` files holding ``0x10de\\n``-style values); the IDs are those of
real parts (H200 0x2335, MI300X 0x74a1 as a processing accelerator, Data Center GPU Max
0x0bd5 as a display controller). See conftest.py for the layout.
"""

from __future__ import annotations

import grp
import os
from pathlib import Path

import pytest
from host.hostlayouts import (
    H200,
    HOST_BRIDGE,
    IGPU,
    MAX1550,
    MI300X,
    RADEON,
    ROOT_PORT,
    USB,
    make_dev,
    make_sysfs,
)

from builder.config.errors import UserError
from builder.host import hardware
from builder.host.hardware import Gpu, HostGpus, choose_vendor, detect


def host(
    tmp_path: Path, *devices: tuple[str, str, str, str], nodes: tuple[str, ...] = (), runtime: bool = False
) -> HostGpus:
    return detect(
        make_sysfs(tmp_path / "sys", *devices), make_dev(tmp_path / "dev", *nodes), nvidia_runtime=runtime
    )


def test_layout_is_the_kernels(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path / "sys", ROOT_PORT, H200)
    link = sysfs / "bus/pci/devices/0000:19:00.0"
    assert link.is_symlink()
    assert os.readlink(link) == "../../../devices/pci0000:00/0000:00:01.0/0000:19:00.0"
    assert (link / "class").read_text() == "0x030200\n"


def test_nvidia_h200(tmp_path: Path) -> None:
    found = host(tmp_path, ROOT_PORT, H200, nodes=("nvidia0", "nvidiactl", "nvidia-uvm"))
    assert found.gpus == (Gpu("0000:19:00.0", "nvidia", "0x2335", "0x030200"),)
    assert found.gpus[0].kind == "3d"
    assert found.nodes.nvidia == (str(tmp_path / "dev/nvidia0"), str(tmp_path / "dev/nvidiactl"))
    assert found.present() == found.usable() == ["nvidia"]
    assert choose_vendor(found, {}) == ("nvidia", "host has usable nvidia GPU(s): 0000:19:00.0 (0x2335)")


def test_nvidia_without_driver_is_present_not_usable(tmp_path: Path) -> None:
    found = host(tmp_path, H200)
    assert found.present() == ["nvidia"] and found.usable() == []
    vendor, why = choose_vendor(found, {})
    assert vendor == "cpu"
    assert "0000:19:00.0" in why and "/dev/nvidia[0-9]*" in why


def test_nvidia_usable_through_runtime_or_cdi(tmp_path: Path) -> None:
    assert host(tmp_path, H200, runtime=True).usable() == ["nvidia"]


def test_amd_mi300x_processing_accelerator(tmp_path: Path) -> None:
    found = host(tmp_path, HOST_BRIDGE, MI300X, nodes=("kfd", "dri/card0", "dri/renderD128"))
    assert [g.kind for g in found.gpus] == ["accelerator"]
    assert found.gpus[0].vendor == "amd" and found.gpus[0].device_id == "0x74a1"
    assert found.usable() == ["amd"]
    assert choose_vendor(found, {})[0] == "amd"


def test_amd_needs_kfd_and_dri(tmp_path: Path) -> None:
    found = host(tmp_path, RADEON, nodes=("dri/renderD128",))
    assert found.gpus[0].kind == "vga"
    assert found.usable() == []
    assert found.missing("amd") == ["/dev/kfd (amdgpu driver with KFD)"]


def test_intel_max_display_controller(tmp_path: Path) -> None:
    found = host(tmp_path, HOST_BRIDGE, USB, MAX1550, nodes=("dri/card1", "dri/renderD129"))
    assert found.gpus == (Gpu("0000:29:00.0", "intel", "0x0bd5", "0x038000"),)
    assert found.nodes.render == (str(tmp_path / "dev/dri/renderD129"),)
    assert choose_vendor(found, {})[0] == "intel"


def test_intel_bridges_and_usb_are_not_gpus(tmp_path: Path) -> None:
    found = host(tmp_path, HOST_BRIDGE, ROOT_PORT, USB)
    assert found.gpus == () and found.present() == []
    assert choose_vendor(found, {}) == ("cpu", "no usable GPU on this host")


def test_empty_host(tmp_path: Path) -> None:
    found = detect(tmp_path / "no-sys", tmp_path / "no-dev")
    assert (
        found.gpus == () and found.nodes.nvidia == () and found.nodes.kfd is None and found.nodes.dri is None
    )
    assert choose_vendor(found, {})[0] == "cpu"


def test_discrete_nvidia_beats_intel_igpu(tmp_path: Path) -> None:
    found = host(tmp_path, HOST_BRIDGE, IGPU, H200, nodes=("nvidia0", "nvidiactl", "dri/renderD128"))
    assert found.usable() == ["nvidia", "intel"]
    vendor, why = choose_vendor(found, {})
    assert vendor == "nvidia" and "preferred over intel" in why


def test_amd_beats_intel_and_nvidia_beats_amd(tmp_path: Path) -> None:
    nodes = ("kfd", "dri/renderD128", "dri/renderD129")
    assert choose_vendor(host(tmp_path / "a", IGPU, MI300X, nodes=nodes), {})[0] == "amd"
    assert (
        choose_vendor(host(tmp_path / "b", IGPU, MI300X, H200, nodes=(*nodes, "nvidia0")), {})[0] == "nvidia"
    )


def test_unusable_vendor_is_skipped(tmp_path: Path) -> None:
    # NVIDIA card without its driver beside a working Intel iGPU: run on the iGPU.
    found = host(tmp_path, IGPU, H200, nodes=("dri/renderD128",))
    assert choose_vendor(found, {})[0] == "intel"


def test_builder_vendor_forces(tmp_path: Path) -> None:
    found = host(tmp_path, H200, nodes=("nvidia0",))
    assert choose_vendor(found, {"BUILDER_VENDOR": "cpu"}) == ("cpu", "forced by BUILDER_VENDOR=cpu")
    assert choose_vendor(HostGpus(), {"BUILDER_VENDOR": "AMD"})[0] == "amd"
    with pytest.raises(
        UserError, match="BUILDER_VENDOR='cuda' is not a vendor; use one of nvidia, amd, intel, cpu"
    ):
        choose_vendor(found, {"BUILDER_VENDOR": "cuda"})


def test_unreadable_entries_are_skipped(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path / "sys", H200)
    (sysfs / "bus/pci/devices/0000:aa:00.0").mkdir()  # no vendor file: a function going away
    assert [g.address for g in hardware.pci_gpus(sysfs)] == ["0000:19:00.0"]


def test_this_machine_does_not_crash() -> None:
    # Real sysfs: whatever it holds, host bridges and virtio devices are never GPUs.
    for gpu in hardware.pci_gpus("/sys"):
        assert gpu.vendor in ("nvidia", "amd", "intel")


def test_cdi_specs(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "etc/nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    (tmp_path / "run/intel.json").write_text(
        '{"cdiVersion": "0.6.0", "kind": "intel.com/gpu", "devices": []}'
    )
    (tmp_path / "run/broken.yaml").write_text("kind: [")
    assert hardware.cdi_specs([tmp_path / "etc", tmp_path / "run"]) == [str(tmp_path / "etc/nvidia.yaml")]
    assert hardware.cdi_specs([tmp_path / "run"], kind="intel.com/gpu") == [
        str(tmp_path / "run/intel.json")
    ]
    assert hardware.cdi_specs([tmp_path / "missing"]) == []


def test_group_gids_from_the_host_group_database() -> None:
    root = grp.getgrgid(0).gr_name
    assert hardware.group_gids([root, "no-such-group-xyz"]) == {root: 0}


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another group needs root")
def test_device_gids_are_the_nodes_owners(tmp_path: Path) -> None:
    # The pitfall: the host's render GID (here 4242) is not the image's; it must come from the node.
    nodes = hardware.device_nodes(
        make_dev(tmp_path / "dev", "kfd", "dri/renderD128", "dri/card0", gid=4242)
    )
    assert hardware.device_gids(nodes) == {
        str(tmp_path / "dev/kfd"): 4242,
        str(tmp_path / "dev/dri/renderD128"): 4242,
    }
    expected = sorted({4242, *hardware.group_gids(["video", "render"]).values()} - {0})
    assert hardware.container_gids(["video", "render"], nodes) == expected


def test_root_owned_nodes_add_no_group(tmp_path: Path) -> None:
    nodes = hardware.device_nodes(make_dev(tmp_path / "dev", "kfd", gid=0 if os.geteuid() == 0 else None))
    assert nodes.kfd is not None
    if os.stat(nodes.kfd).st_gid == 0:
        assert 0 not in hardware.container_gids([], nodes)
