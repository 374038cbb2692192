"""Accelerator probe: real gathering on this host (asserting what torch sees here), recorded facts elsewhere.

The NVIDIA, AMD and Intel cases use fixtures/torch_facts_*.json: recordings of
what torch reports on those machines, because we lack the hardware here.
"""

from __future__ import annotations

import json

import pytest
from ml_runtime.devices.facts import TorchFacts, gather_torch_facts
from ml_runtime.devices.host import (
    HostFacts,
    cpu_model,
    gather_host_facts,
    parse_amd_smi_driver,
    parse_nvidia_proc_version,
    parse_rocm_smi_driver,
    parse_xpu_smi_driver,
)
from ml_runtime.devices.probe import build_probe, choose_distributed_backend, format_probe, probe_host
from ml_runtime.devices.tools import ToolResult


def torch_sees() -> tuple[str | None, int]:
    """(accelerator type, device count) as this host's torch sees them."""
    import torch

    for kind in ("cuda", "xpu"):
        module = getattr(torch, kind, None)
        if module is not None and module.is_available():
            return kind, module.device_count()
    return None, 0


def test_real_probe_says_what_this_host_has(workspace):
    import torch  # a torch build must be installed for these tests (see tests/runtime/conftest.py)

    result = probe_host()
    kind, count = torch_sees()
    expected = {"cuda": ("amd", "rocm") if torch.version.hip else ("nvidia", "cuda"), "xpu": ("intel", "xpu"),
                None: ("none", "cpu")}[kind]
    assert (result.vendor, result.backend) == expected
    assert len(result.devices) == count
    assert result.torch["version"] == torch.__version__
    assert result.torch["cuda"] == torch.version.cuda
    assert result.distributed_backend == choose_distributed_backend(expected[1], torch.__version__,
                                                                    result.distributed_backends)
    assert result.distributed_available and result.distributed_backends["gloo"]
    assert result.cpu["cores"] >= 1 and result.cpu["model"]
    text = format_probe(result)
    assert f"vendor: {expected[0]}" in text and f"backend: {expected[1]}" in text and "cpu: " in text
    json.dumps(result.to_dict())  # JSON-serialisable


def test_real_gathering_uses_the_vendor_neutral_api():
    import torch  # a torch build must be installed for these tests (see tests/runtime/conftest.py)

    facts = gather_torch_facts()
    kind, count = torch_sees()
    assert facts.torch_version == torch.__version__
    assert facts.accelerator_api == hasattr(torch, "accelerator")
    assert facts.accelerator_type == kind and len(facts.devices) == count
    assert TorchFacts.from_dict(facts.to_dict()) == facts  # the recording format round-trips


def test_nvidia_recording(recorded_facts):
    result = build_probe(
        recorded_facts("nvidia"), HostFacts(driver_version="550.54.15", driver_source="nvml")
    )
    assert (result.vendor, result.backend, result.distributed_backend) == ("nvidia", "cuda", "nccl")
    assert [d.capability and d.capability.text for d in result.devices] == ["sm_75", "sm_80", "sm_90"]
    assert result.devices[1].name == "NVIDIA A100-SXM4-40GB"
    assert result.devices[1].to_dict()["memory_total_mib"] == 40536
    assert result.torch["flavour"] == "cuda 12.4" and result.torch["local"] == "cu124"
    assert "driver: 550.54.15 (nvml)" in format_probe(result)


def test_amd_recording_reports_through_torch_cuda_with_hip_set(recorded_facts):
    result = build_probe(recorded_facts("amd"))
    assert (result.vendor, result.backend) == ("amd", "rocm")
    assert result.distributed_backend == "nccl"  # RCCL is exposed under the nccl name
    mi300 = result.devices[1]
    assert mi300.to_dict()["gcn_arch_name"] == "gfx942:sramecc+:xnack-"
    assert mi300.capability is not None and mi300.capability.text == "gfx942"
    assert result.torch["flavour"] == "rocm 6.2" and result.torch["cuda"] is None
    assert "gfx90a:sramecc+:xnack-" in format_probe(result)


def test_intel_recording(recorded_facts):
    result = build_probe(
        recorded_facts("intel"), HostFacts(driver_version="1.6.31294+21", driver_source="torch.xpu")
    )
    assert (result.vendor, result.backend, result.distributed_backend) == ("intel", "xpu", "xccl")
    device = result.devices[0].to_dict()
    assert device["device_id"] == "0x0bd5" and device["family"] == "pvc"
    assert device["name"] == "Intel(R) Data Center GPU Max 1550"


def test_intel_before_torch_2_8_uses_ccl(recorded_facts):
    facts = recorded_facts(
        "intel", torch_version="2.7.0+xpu", distributed_backends={"gloo": True, "xccl": False}
    )
    assert build_probe(facts).distributed_backend == "ccl"
    assert choose_distributed_backend("xpu", "2.7.0+xpu", {"xccl": True}) == "xccl"  # special 2.7 builds


def test_cuda_build_without_devices_explains_itself():
    facts = TorchFacts(torch_version="2.7.1+cu126", cuda_version="12.6", distributed_available=True)
    result = build_probe(facts, HostFacts(device_nodes=[]))
    assert (result.vendor, result.backend) == ("none", "cpu")
    assert any("cuda 12.6 build but no device is visible" in n for n in result.notes)


def test_cpu_build_with_nvidia_device_node_is_noted():
    result = build_probe(TorchFacts(torch_version="2.6.0+cpu"), HostFacts(device_nodes=["/dev/nvidiactl"]))
    assert any("torch has no CUDA support" in n for n in result.notes)


def test_missing_torch_is_reported_not_raised():
    result = build_probe(
        TorchFacts(torch_version=None, import_error="ModuleNotFoundError: No module named 'torch'")
    )
    assert result.backend == "cpu" and result.torch["version"] is None
    assert any("torch is not importable" in n for n in result.notes)


def test_driver_version_parsers(fixture_text):
    assert parse_nvidia_proc_version(fixture_text("nvidia_proc_version.txt")) == "535.54.03"
    assert parse_nvidia_proc_version(fixture_text("nvidia_proc_version_open.txt")) == "570.86.15"
    assert parse_amd_smi_driver(fixture_text("amd-smi_static.txt")) == "6.8.5"
    assert (
        parse_rocm_smi_driver("=== ROCm System Management Interface ===\nDriver version: 6.8.5\n") == "6.8.5"
    )
    assert parse_xpu_smi_driver('Device ID,Driver Version\n0,"I915_23.10.32_PSB_231129.32"\n') == (
        "I915_23.10.32_PSB_231129.32"
    )


def test_host_facts_fall_back_through_tools(fixture_text):
    def runner(argv):
        if argv[0] == "amd-smi":
            return ToolResult(True, fixture_text("amd-smi_static.txt"))
        return ToolResult(False, "", f"{argv[0]} not found on PATH")

    host = gather_host_facts("amd", runner=runner)
    if host.driver_source == "/sys/module/amdgpu/version":  # only on a real AMD host
        pytest.skip("this machine has an amdgpu module")
    assert (host.driver_version, host.driver_source) == ("6.8.5", "amd-smi")
    assert any("/sys/module/amdgpu/version" in n for n in host.notes)


def test_host_facts_never_raise_when_tools_are_missing():
    host = gather_host_facts("nvidia", runner=lambda argv: ToolResult(False, "", "missing"))
    assert host.cpu_cores and host.cpu_logical
    if host.driver_version is None:
        assert any("nvidia-smi: missing" in n for n in host.notes)


def test_cpu_model_from_cpuinfo_variants():
    assert (
        cpu_model("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n")
        == "Intel(R) Xeon(R) Platinum 8480+"
    )
    assert cpu_model("processor\t: 0\nCPU implementer\t: 0x41\n") is None
