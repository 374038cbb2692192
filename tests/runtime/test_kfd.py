"""AMD GPUs from the KFD topology, without HIP or torch: a start on an AMD host asks the kernel's sysfs.

We have no AMD GPU. The trees here are laid out as the amdgpu driver lays out
``/sys/class/kfd/kfd/topology/nodes/N/properties`` (one ``key value`` per line; a CPU node has
``gfx_target_version 0``) and ``/dev/dri/renderD<minor>``, with the values of an MI250X (two GCDs,
gfx90a, 64 GiB each) and an MI300X (gfx942) as torch reported them on those machines
(fixtures/torch_facts_amd.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ml_runtime.devices import gather
from ml_runtime.devices.capability import amd_capability
from ml_runtime.devices.facts import TorchFacts, build_facts
from ml_runtime.devices.kfd import gfx_name, read_kfd, visible_gpus
from ml_runtime.devices.probe import build_probe

FIXTURES = Path(__file__).resolve().parent / "fixtures"

CPU_NODE = "cpu_cores_count 64\nsimd_count 0\nmem_banks_count 1\ngfx_target_version 0\ndrm_render_minor 0\n"


def gpu_node(gfx: int, minor: int, memory: int | None) -> str:
    local = f"local_mem_size {memory}\n" if memory is not None else ""
    return (f"cpu_cores_count 0\nsimd_count 440\nmem_banks_count 1\ngfx_target_version {gfx}\n"
            f"vendor_id 4098\ndevice_id 29704\ndrm_render_minor {minor}\n{local}")


@pytest.fixture
def amd_host(tmp_path: Path) -> Path:
    """A CPU node, two MI250X GCDs (gfx90a) and an MI300X (gfx942) whose size is in its memory bank."""
    nodes = tmp_path / "sys/class/kfd/kfd/topology/nodes"
    for n, text in enumerate([CPU_NODE, gpu_node(90010, 128, 68702699520), gpu_node(90010, 129, 68702699520),
                              gpu_node(90402, 130, None)]):
        (nodes / str(n)).mkdir(parents=True)
        (nodes / str(n) / "properties").write_text(text)
    bank = nodes / "3" / "mem_banks" / "0"
    bank.mkdir(parents=True)
    (bank / "properties").write_text("heap_type 1\nsize_in_bytes 205822885888\n")
    (tmp_path / "dev/dri").mkdir(parents=True)
    for minor in (128, 129, 130):
        (tmp_path / f"dev/dri/renderD{minor}").touch()
    product = tmp_path / "sys/class/drm/renderD128/device"
    product.mkdir(parents=True)
    (product / "product_name").write_text("AMD Instinct MI250X\n")
    return tmp_path


def test_gfx_targets_as_the_kernel_numbers_them():
    assert [gfx_name(v) for v in (90010, 90402, 90500, 100300, 110000, 110501)] == [
        "gfx90a", "gfx942", "gfx950", "gfx1030", "gfx1100", "gfx1151"]


def test_the_gpus_as_torch_reported_them(amd_host):
    recorded = json.loads((FIXTURES / "torch_facts_amd.json").read_text())["devices"]
    gpus = read_kfd(amd_host)
    assert [g.gcn_arch_name for g in gpus] == ["gfx90a", "gfx90a", "gfx942"]
    assert [g.total_memory for g in gpus] == [recorded[0]["total_memory"]] * 2 + [recorded[1]["total_memory"]]
    assert [g.name for g in gpus] == ["AMD Instinct MI250X", "AMD gfx90a", "AMD gfx942"]  # product_name where given
    assert [amd_capability(g.gcn_arch_name) for g in gpus] == [
        amd_capability(recorded[0]["gcn_arch_name"])] * 2 + [amd_capability(recorded[1]["gcn_arch_name"])]


def test_a_gpu_not_given_to_the_container_is_not_listed(amd_host):
    (amd_host / "dev/dri/renderD129").unlink()  # docker run --device /dev/dri/renderD128 --device ...130
    assert [g.gcn_arch_name for g in read_kfd(amd_host)] == ["gfx90a", "gfx942"]
    assert [g.index for g in read_kfd(amd_host)] == [0, 1]


def test_visibility_variables_as_rocm_applies_them(amd_host):
    gpus = read_kfd(amd_host)

    def archs(env: dict[str, str]) -> list[str | None] | None:
        devices, _ = visible_gpus(gpus, env)
        return None if devices is None else [d.gcn_arch_name for d in devices]

    assert archs({}) == ["gfx90a", "gfx90a", "gfx942"]
    assert archs({"HIP_VISIBLE_DEVICES": "2,0"}) == ["gfx942", "gfx90a"]
    assert archs({"CUDA_VISIBLE_DEVICES": "2"}) == ["gfx942"]  # HIP reads it when HIP_VISIBLE_DEVICES is unset
    assert archs({"ROCR_VISIBLE_DEVICES": "1,2", "HIP_VISIBLE_DEVICES": "1"}) == ["gfx942"]  # ROCr's, then HIP's
    assert archs({"HIP_VISIBLE_DEVICES": ""}) is None  # left to torch: not guessed
    assert archs({"ROCR_VISIBLE_DEVICES": "GPU-4a1c2b3d"}) is None


def test_a_rocm_build_on_this_host_is_probed_without_torch(amd_host, monkeypatch, tmp_path):
    # The AMD machine's torch build, recorded; the host's devices from the tree above.
    recorded = build_facts(TorchFacts.from_dict(json.loads((FIXTURES / "torch_facts_amd.json").read_text())))
    (amd_host / "dev/kfd").touch()
    monkeypatch.setattr(gather, "recorded_torch_facts", lambda environ: recorded)
    gathered = gather.gather_facts(environ={"RUNTIME_HOST_ROOT": str(amd_host), "HIP_VISIBLE_DEVICES": "0,2"})
    assert (gathered.source, gathered.torch_reason) == ("record+kfd", None)
    probe = build_probe(gathered.facts)
    assert (probe.vendor, probe.backend, probe.distributed_backend) == ("amd", "rocm", "nccl")
    assert [d.capability.text if d.capability else None for d in probe.devices] == ["gfx90a", "gfx942"]
