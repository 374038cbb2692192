"""Replays of real outputs recorded on an NVIDIA H200 host (2026-11-30, torch 2.11.0+cu130, driver
580.159.04): `runtime-check probe --json --self-test` and `runtime-check metrics --json`, run from
this checkout on the lent GPU machine (tests/runtime/fixtures/recorded/). The design notes' spec
and accelerator config are evaluated against that real host description."""

from __future__ import annotations

import json
from pathlib import Path

from ml_runtime.api import notes_fields
from ml_runtime.contract.checks import run_checks
from ml_runtime.contract.locate import load_spec
from ml_runtime.contract.packages import check_wheel
from ml_runtime.contract.spec import Dependency
from ml_runtime.devices.capability import parse_capability
from ml_runtime.devices.probe import DeviceInfo, ProbeResult
from ml_runtime.devices.smi import DeviceMetrics
from ml_runtime.policy.config import load_accelerator_config
from ml_runtime.policy.selection import select_devices

RECORDED = Path(__file__).parent / "fixtures" / "recorded"
NOTES = Path(__file__).resolve().parents[1] / "fixtures" / "notes"


def recorded_probe() -> ProbeResult:
    data = json.loads((RECORDED / "h200-2026-11-30-probe.json").read_text())
    devices = [
        DeviceInfo(d["index"], d["name"], d["vendor"], parse_capability(d["compute_capability"]),
                   d["memory_total_bytes"], uuid=d.get("uuid"))
        for d in data["devices"]
    ]
    return ProbeResult(
        vendor=data["vendor"], backend=data["backend"], torch=data["torch"], devices=devices,
        driver_version=data["driver"]["version"], driver_source=data["driver"]["source"],
        distributed_available=data["distributed"]["available"], distributed_backend=data["distributed"]["backend"],
        distributed_backends=data["distributed"]["backends"],
    )


def test_the_recording_is_a_real_h200_that_computed():
    data = json.loads((RECORDED / "h200-2026-11-30-probe.json").read_text())
    assert data["torch"]["flavour"] == "cuda 13.0" and data["torch"]["public_version"] == "2.11.0"
    assert data["self_test"]["compute"]["cuda"] == {"ok": True, "value": 83.0}


def test_notes_gpu_spec_passes_on_the_h200():
    spec = load_spec(str(NOTES / "runtime-spec-gpu.yaml"))
    probe = recorded_probe()
    results = {r.item: r for r in run_checks(spec, probe, probe.devices)}
    assert results["gpu_compute_capability"].ok  # sm_90 >= sm_80
    assert results["driver_version_min"].ok  # 580.159.04 >= 535.54.03
    # The recording measured no bandwidth (the probe measures it only when a spec asks): not replayed.
    assert results["pytorch.vendor_agnostic_wheel"].ok  # +cu130: an official index build


def test_gfx90a_spec_fails_on_the_h200():
    spec = load_spec(str(NOTES / "runtime-spec-gfx90a.yaml"))
    (result,) = run_checks(spec, recorded_probe())
    assert not result.ok and "AMD" in (result.reason or "")


def test_notes_accelerator_config_chooses_priority_1_on_the_h200():
    config = load_accelerator_config(NOTES / "accelerator-config.yaml")
    assert config is not None
    selection = select_devices(config, recorded_probe(), environ={})
    assert selection.ok and selection.priority == 1
    assert selection.env["CUDA_VISIBLE_DEVICES"] == "0"


def test_image_mapping_check_against_the_recorded_torch():
    dep = Dependency("pytorch", None, False, "d", vendor_agnostic_wheel=True)
    probe = recorded_probe()
    assert check_wheel(dep, probe, {"ML_RUNTIME_TORCH": "2.11.0", "ML_RUNTIME_FLAVOUR": "cuda 13.0"}).ok
    assert not check_wheel(dep, probe, {"ML_RUNTIME_TORCH": "2.14.1", "ML_RUNTIME_FLAVOUR": "cuda 13.0"}).ok


def test_recorded_nvml_metrics_in_the_notes_fields():
    data = json.loads((RECORDED / "h200-2026-11-30-metrics.json").read_text())
    (device,) = [notes_fields(DeviceMetrics(**d)) for d in data["devices"]]
    assert device["gpu_vendor"] == "nvidia" and device["gpu_model"] == "NVIDIA H200"
    assert all(device[k] is not None for k in ("gpu_util_percent", "gpu_temp_c", "gpu_mem_used_mb"))
    assert device["gpu_mem_total_mb"] == round(143771.0 * 2**20 / 10**6, 1)
