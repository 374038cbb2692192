"""Container start without importing torch: the facts recorded at image build stand in for it.

The image build runs ``python -m ml_runtime.devices.facts --record FILE`` (no accelerator is visible
there); a start reads the file instead of importing torch, and asks the host for the devices.
These tests record with the real torch installed for the test suite. The "device node" of
the last tests is a file in a temporary folder laid out like /dev (we have no GPU); a CUDA build
on a recorded NVIDIA host is tests/runtime/test_h200_start.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ml_runtime.contract.checks import run_checks
from ml_runtime.contract.fields import load_yaml_mapping
from ml_runtime.contract.spec import DEFAULT_SPEC_PATH
from ml_runtime.contract.spec_file import parse_spec
from ml_runtime.devices import facts as facts_module
from ml_runtime.devices import host
from ml_runtime.devices.facts import build_facts, gather_torch_facts, record_torch_facts
from ml_runtime.devices.gather import gather_facts
from ml_runtime.devices.host import gather_host_facts
from ml_runtime.devices.isolated import gather_torch_facts_isolated, recorded_torch_facts
from ml_runtime.devices.probe import build_probe, classify

SPECS = [
    {"dependencies": [{"name": "pytorch", "version_range": ">=2.0", "full_distribution": True}]},
    {"dependencies": [{"name": "pytorch", "version_range": ">=3.0", "full_distribution": True}]},
    {"dependencies": [{"name": "pytorch", "version_range": ">=2.0", "vendor_agnostic_wheel": True}]},
    {"required_features": [{"gpu_compute_capability": "sm_80"}, {"device_memory_gb": 40}]},
    {"required_features": [{"driver_version_min": "535.54.03"}],
     "dependencies": [{"name": "accelerate", "version_range": ">=0.20"}]},
]


@pytest.fixture(autouse=True)
def no_accelerator_nodes(monkeypatch, tmp_path):
    # Whatever this host has, the tests decide which device nodes exist.
    monkeypatch.setattr(host, "ACCELERATOR_NODES", (str(tmp_path / "dev" / "nvidia[0-9]*"),))
    return tmp_path / "dev"


@pytest.fixture
def record(tmp_path) -> Path:
    path = tmp_path / "share" / "ml-runtime" / "torch-facts.json"
    assert facts_module.main(["--record", str(path)]) == 0
    return path


def verdicts(spec_data: dict, facts) -> list[dict]:
    vendor, _ = classify(facts)
    probe = build_probe(facts, gather_host_facts(vendor, facts))
    spec = parse_spec(spec_data, "runtime-spec.yaml")
    return [r.to_dict("strict") for r in run_checks(spec, probe, probe.devices)]


def test_the_record_is_what_torch_says_and_byte_stable(record, tmp_path):
    recorded = recorded_torch_facts(record, environ={})
    assert recorded is not None and recorded.to_dict() == build_facts(gather_torch_facts()).to_dict()
    again = tmp_path / "again.json"
    record_torch_facts(again)
    assert again.read_bytes() == record.read_bytes()  # same torch, same bytes: the layer stays reproducible


@pytest.mark.parametrize("spec_data", SPECS + [load_yaml_mapping(DEFAULT_SPEC_PATH, "default-spec.yaml")])
def test_every_verdict_is_the_same_as_importing_torch(record, spec_data, monkeypatch):
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):  # torch shown what the record's host had
        monkeypatch.setenv(name, "")
    from_record = gather_facts(environ={"RUNTIME_RECORD_DIR": str(record.parent)})
    assert from_record.source == "record"
    assert verdicts(spec_data, from_record.facts) == verdicts(spec_data, gather_torch_facts_isolated(timeout=300))


def test_runtime_probe_torch_ignores_the_record(record):
    assert recorded_torch_facts(record, environ={"RUNTIME_PROBE": "torch"}) is None


def test_another_torch_than_the_recorded_one_ignores_the_record(record):
    document = json.loads(record.read_text())
    document["torch_install"] = "0" * 64  # as if torch had been reinstalled in a derived image
    record.write_text(json.dumps(document))
    assert recorded_torch_facts(record, environ={}) is None


def test_a_damaged_or_missing_record_is_ignored(record, tmp_path):
    record.write_text("{not json")
    assert recorded_torch_facts(record, environ={}) is None
    assert recorded_torch_facts(tmp_path / "none.json", environ={}) is None


def test_the_record_holds_on_a_host_with_device_nodes(record, no_accelerator_nodes):
    no_accelerator_nodes.mkdir()
    (no_accelerator_nodes / "nvidia0").touch()
    assert recorded_torch_facts(record, environ={}) is not None  # torch's build does not change with the host


def test_a_cpu_build_never_asks_torch_even_beside_a_gpu(record, no_accelerator_nodes):
    # torch's CPU build sees no device on any host: the record alone answers. (The record says a CPU
    # build whatever torch this host has, as the cpu image's does.)
    document = json.loads(record.read_text())
    document["facts"].update(cuda_version=None, hip_version=None, xpu_build=False)
    record.write_text(json.dumps(document))
    no_accelerator_nodes.mkdir()
    (no_accelerator_nodes / "nvidia0").touch()
    gathered = gather_facts(environ={"RUNTIME_RECORD_DIR": str(record.parent)})
    assert (gathered.source, gathered.torch_reason, gathered.facts.devices) == ("record", None, [])


def test_without_a_record_torch_is_imported_and_the_reason_said(tmp_path):
    gathered = gather_facts(environ={"RUNTIME_RECORD_DIR": str(tmp_path / "none")})
    assert gathered.source == "torch" and gathered.torch_reason is not None
    assert gathered.torch_reason.startswith("no build-time record of this torch's facts")
    assert gathered.torch_reason.endswith("torch imported in a child process, a few seconds")
