"""Contract items: OK / FAIL / WARN on recorded NVIDIA, AMD and Intel facts and on this CPU host.

fixtures/torch_facts_*.json are recordings of torch on machines we lack.
"""

from __future__ import annotations

import pytest
from ml_runtime.contract.checks import run_checks
from ml_runtime.contract.fields import version_tuple
from ml_runtime.contract.spec_file import parse_spec
from ml_runtime.devices.facts import TorchFacts
from ml_runtime.devices.host import HostFacts
from ml_runtime.devices.probe import build_probe
from ml_runtime.report.text import summary_line


def spec(**data):
    return parse_spec(data, "runtime-spec.yaml")


def features(*items):
    return spec(required_features=list(items))


@pytest.fixture
def nvidia(recorded_facts):
    return build_probe(recorded_facts("nvidia"), HostFacts(driver_version="550.54.15", driver_source="nvml"))


@pytest.fixture
def amd(recorded_facts):
    return build_probe(recorded_facts("amd"), HostFacts(driver_version="6.8.5", driver_source="amd-smi"))


@pytest.fixture
def intel(recorded_facts):
    return build_probe(
        recorded_facts("intel"), HostFacts(driver_version="1.6.31294+21", driver_source="torch.xpu")
    )


@pytest.fixture
def cpu():
    facts = TorchFacts(
        torch_version="2.13.0+cpu", distributed_available=True, distributed_backends={"gloo": True}
    )
    return build_probe(facts)


def test_sm80_on_amd_is_a_clear_vendor_mismatch(amd):
    (result,) = run_checks(features({"gpu_compute_capability": "sm_80"}), amd)
    assert not result.ok
    assert result.reason == "requires an NVIDIA GPU (sm_80) but found AMD gfx90a"
    assert result.line("strict") == (
        "[CHECK] gpu_compute_capability: [0] AMD Instinct MI250X (gfx90a), [1] AMD Instinct MI300X (gfx942)"
        " -> FAIL (requires an NVIDIA GPU (sm_80) but found AMD gfx90a)"
    )
    assert result.suggestion == "run on a host with an NVIDIA GPU of compute capability >= 8.0"


def test_gpu_features_fail_on_a_cpu_host(cpu):
    results = run_checks(
        features(
            {"gpu_compute_capability": "sm_80"},
            {"memory_bandwidth_gbps": "auto"},
            {"driver_version_min": "535.54.03"},
            {"device_memory_gb": 40},
        ),
        cpu,
    )
    assert [r.ok for r in results] == [False] * 4
    assert all("no accelerator was found" in (r.reason or "") for r in results)
    assert results[0].found == "no accelerator (CPU only)"


def test_compute_capability_must_hold_on_every_device(nvidia):
    (result,) = run_checks(features({"gpu_compute_capability": "sm_80"}), nvidia)
    assert not result.ok
    assert (result.reason or "").startswith("device 0 (Tesla T4): requires compute capability >= 8.0")
    # Restricted to the devices the command will see (e.g. after selection) it passes.
    (result,) = run_checks(features({"gpu_compute_capability": "sm_80"}), nvidia, devices=nvidia.devices[1:])
    assert result.ok and result.line("strict").endswith("-> OK")


def test_amd_and_intel_capabilities_pass_on_their_own_hardware(amd, intel):
    (result,) = run_checks(features({"gpu_compute_capability": "gfx90a"}), amd)
    assert result.ok  # gfx90a and gfx942 both satisfy gfx90a
    (result,) = run_checks(features({"gpu_compute_capability": "gfx942"}), amd)
    assert not result.ok and "device 0 (AMD Instinct MI250X): requires gfx942 or newer" in (result.reason or "")
    (result,) = run_checks(features({"gpu_compute_capability": "pvc"}), intel)
    assert result.ok and "x2" in result.found


def test_device_memory_uses_decimal_gigabytes(nvidia):
    a100_40gb = nvidia.devices[1]
    (result,) = run_checks(features({"device_memory_gb": 40}), nvidia, devices=[a100_40gb])
    assert result.ok and result.found == "42.5 GB"  # an "A100 40GB" has 39.6 GiB: GB, not GiB
    (result,) = run_checks(features({"device_memory_gb": 40}), nvidia)
    assert not result.ok and result.found == "15.8 GB (smallest of 3 devices)"
    assert "device 0 (Tesla T4) has 15.8 GB" in (result.reason or "")


def measured_nvidia(recorded_facts, **errors):
    """The recorded NVIDIA facts plus recorded copy-bandwidth figures (GB/s)."""
    facts = recorded_facts("nvidia")
    for device, gbps in zip(facts.devices, (280.0, 1400.0, 2900.0)):
        device.bandwidth_gbps = gbps
    for index, error in errors.items():
        facts.devices[int(index[1:])].bandwidth_gbps = None
        facts.devices[int(index[1:])].bandwidth_error = error
    return build_probe(facts)


def test_bandwidth_measured_auto_and_minimum(recorded_facts):
    probe = measured_nvidia(recorded_facts)
    (auto,) = run_checks(features({"memory_bandwidth_gbps": "auto"}), probe, devices=probe.devices[2:])
    assert auto.ok and auto.found == "2900 GB/s (measured)"
    (need,) = run_checks(features({"memory_bandwidth_gbps": 2000}), probe, devices=probe.devices[1:])
    assert not need.ok and need.found == "1400 GB/s (measured, slowest of 2 devices)"
    assert need.reason == "device 1 (NVIDIA A100-SXM4-40GB): requires >= 2000 GB/s"
    assert probe.devices[2].to_dict()["bandwidth_gbps"] == 2900.0


def test_bandwidth_measurement_failure_is_reported(recorded_facts):
    probe = measured_nvidia(recorded_facts, d0="OutOfMemoryError: CUDA out of memory")
    (result,) = run_checks(features({"memory_bandwidth_gbps": "auto"}), probe)
    assert (
        not result.ok and result.reason == "measuring device 0 failed: OutOfMemoryError: CUDA out of memory"
    )
    (unmeasured,) = run_checks(
        features({"memory_bandwidth_gbps": "auto"}), build_probe(recorded_facts("nvidia"))
    )
    assert "no measurement was taken" in (unmeasured.reason or "")


def test_copy_bandwidth_arithmetic_on_cpu_tensors():
    import torch  # the CPU build must be installed for these tests (see tests/runtime/conftest.py)
    from ml_runtime.devices.bandwidth import copy_bandwidth_gbps

    assert copy_bandwidth_gbps(torch.device("cpu"), lambda: None, size_bytes=8 << 20, repeats=2) > 0.1


def test_driver_version_compared_numerically(nvidia):
    assert version_tuple("535.54.03") == (535, 54, 3)
    (ok,) = run_checks(features({"driver_version_min": "535.54.03"}), nvidia)
    assert ok.ok and ok.found == "550.54.15 (nvml)"
    (newer,) = run_checks(features({"driver_version_min": "550.100"}), nvidia)
    assert not newer.ok and newer.reason == "requires NVIDIA driver >= 550.100"  # 54 < 100 numerically


def test_driver_minimum_belongs_to_the_spec_vendor(amd):
    results = run_checks(
        features({"gpu_compute_capability": "sm_80"}, {"driver_version_min": "535.54.03"}), amd
    )
    assert "but the accelerator is AMD" in (results[1].reason or "")
    (per_vendor,) = run_checks(features({"driver_version_min": {"nvidia": "535.54.03", "amd": "6.8.0"}}), amd)
    assert per_vendor.ok and per_vendor.found == "6.8.5 (amd-smi)"


def test_unknown_driver_version_fails_with_a_hint(recorded_facts):
    probe = build_probe(recorded_facts("nvidia"), HostFacts())
    (result,) = run_checks(features({"driver_version_min": "535.54.03"}), probe)
    assert not result.ok and "could not be determined (install nvidia-ml-py for NVML)" in (result.reason or "")


def test_pytorch_range_ignores_the_local_suffix_but_shows_it(nvidia, cpu):
    rng = spec(dependencies=[{"name": "pytorch", "version_range": ">=2.5.0,<2.6.0"}])
    (result,) = run_checks(rng, nvidia)
    assert result.ok and result.line("strict") == "[CHECK] pytorch: 2.5.1+cu124 -> OK"
    (result,) = run_checks(spec(dependencies=[{"name": "pytorch", "version_range": ">=2.1.0,<2.2.0"}]), cpu)
    assert result.line("strict") == "[CHECK] pytorch: 2.13.0+cpu -> FAIL (requires pytorch >=2.1.0,<2.2.0)"
    assert result.line("warn") == "[CHECK] pytorch: 2.13.0+cpu -> WARN (requires pytorch >=2.1.0,<2.2.0)"


def test_nightly_torch_is_in_range():
    probe = build_probe(TorchFacts(torch_version="2.7.0.dev20250101+cpu"))
    (result,) = run_checks(
        spec(dependencies=[{"name": "torch", "version_range": ">=2.7.0.dev0,<2.8"}]), probe
    )
    assert result.ok


def test_other_distributions_are_looked_up_by_name(cpu):
    results = run_checks(
        spec(dependencies=[{"name": "packaging", "version_range": ">=20"}, {"name": "no-such-dist-xyz"}]), cpu
    )
    assert results[0].ok
    assert not results[1].ok and results[1].found == "not available" and "not installed" in (results[1].reason or "")


def test_full_distribution_needs_the_hosts_backend(recorded_facts, cpu):
    dist = spec(dependencies=[{"name": "pytorch", "full_distribution": True}])
    assert (
        run_checks(dist, cpu)[1].line("strict")
        == "[CHECK] pytorch.full_distribution: torch.distributed (gloo) -> OK"
    )
    no_nccl = build_probe(recorded_facts("nvidia", distributed_backends={"gloo": True, "nccl": False}))
    result = run_checks(dist, no_nccl)[1]
    assert not result.ok and result.reason == "requires the nccl backend for cuda"
    old_xpu = build_probe(
        recorded_facts("intel", torch_version="2.7.0+xpu", distributed_backends={"gloo": True})
    )
    result = run_checks(dist, old_xpu)[1]
    assert not result.ok and "oneccl_bindings_for_pytorch" in (result.suggestion or "")
    disabled = build_probe(TorchFacts(torch_version="2.6.0+cpu", distributed_available=False))
    assert "has it disabled" in (run_checks(dist, disabled)[1].reason or "")


def test_json_and_warn_rendering(amd):
    (result,) = run_checks(features({"gpu_compute_capability": "sm_80"}), amd)
    data = result.to_dict("warn")
    assert data["status"] == "WARN" and data["ok"] is False
    assert data["reason"] == "requires an NVIDIA GPU (sm_80) but found AMD gfx90a"


def test_summary_line_is_one_line_with_the_suggestion(amd):
    results = run_checks(features({"gpu_compute_capability": "sm_80"}), amd)
    line = summary_line(results, "strict")
    assert line is not None and "\n" not in line
    assert line == (
        "runtime-check: 1 of 1 checks failed: run on a host with an NVIDIA GPU of compute capability >= 8.0, "
        "or set RUNTIME_CHECK_MODE=warn"
    )
    assert summary_line([], "strict") is None
