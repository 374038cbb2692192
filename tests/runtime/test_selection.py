"""Device selection from accelerator-config.yaml (recorded NVIDIA/AMD/Intel facts; we lack the hardware)."""

from __future__ import annotations

import pytest
from ml_runtime.devices.facts import TorchFacts
from ml_runtime.devices.probe import build_probe
from ml_runtime.errors import ConfigError
from ml_runtime.policy.config import load_accelerator_config, parse_accelerator_config, resolve_config_path
from ml_runtime.policy.selection import select_devices, visible_tokens

EXAMPLE = """\
backend: auto            # auto | cuda | rocm | xpu | cpu
criteria:                # ordered; devices must satisfy all; then sorted by the order given
  - min_compute_capability: "sm_80"
  - vendor: nvidia
  - min_memory_gb: 40
count: 2                 # how many devices to pick (default: all that match)
"""


def config(**data):
    return parse_accelerator_config(data, "accelerator-config.yaml")


@pytest.fixture
def nvidia(recorded_facts):
    return build_probe(
        recorded_facts("nvidia")
    )  # [0] T4 sm_75 15.8 GB, [1] A100 sm_80 42.5 GB, [2] H100 sm_90 85 GB


def test_documented_example_picks_the_best_devices_first(tmp_path, nvidia):
    path = tmp_path / "accelerator-config.yaml"
    path.write_text(EXAMPLE, encoding="utf-8")
    cfg = load_accelerator_config(str(path), {})
    assert cfg is not None
    selection = select_devices(cfg, nvidia, environ={})
    assert selection.ok
    assert [d.index for d in selection.devices] == [2, 1]  # sm_90 before sm_80; T4 filtered out
    assert selection.env == {"CUDA_VISIBLE_DEVICES": "2,1"}


def test_default_count_is_all_matching(nvidia):
    selection = select_devices(config(criteria=[{"min_memory_gb": 40}]), nvidia, environ={})
    assert [d.index for d in selection.devices] == [2, 1]  # sorted by memory, largest first


def test_filter_only_criteria_keep_device_order(nvidia):
    selection = select_devices(config(criteria=[{"vendor": "nvidia"}], count=2), nvidia, environ={})
    assert selection.env == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_too_few_devices_is_a_problem(nvidia):
    selection = select_devices(
        config(criteria=[{"min_compute_capability": "sm_90"}], count=2), nvidia, environ={}
    )
    assert not selection.ok
    assert selection.problems == [
        "only 1 of the requested 2 devices satisfy the criteria (min_compute_capability sm_90)"
    ]
    assert selection.env == {"CUDA_VISIBLE_DEVICES": "2"}  # warn mode still gets what matched


def test_no_match_names_the_devices(nvidia):
    selection = select_devices(config(criteria=[{"name": "MI300"}]), nvidia, environ={})
    assert not selection.ok and "no device satisfies the criteria (name MI300)" in selection.problems[0]
    assert selection.env == {}


def test_backend_mismatch_on_a_cpu_host():
    cpu = build_probe(TorchFacts(torch_version="2.13.0+cpu"))
    selection = select_devices(config(backend="cuda"), cpu, environ={})
    assert selection.problems == [
        "backend cuda requested but this host has no NVIDIA accelerator (found: none, CPU only)"
    ]


def test_backend_mismatch_between_vendors(recorded_facts):
    amd = build_probe(recorded_facts("amd"))
    selection = select_devices(config(backend="cuda"), amd, environ={})
    assert "no NVIDIA accelerator (found: AMD (rocm))" in selection.problems[0]


def test_each_vendor_uses_its_own_visibility_variable(recorded_facts):
    amd = select_devices(
        config(backend="rocm", criteria=[{"min_compute_capability": "gfx942"}]),
        build_probe(recorded_facts("amd")),
        environ={},
    )
    assert amd.ok and amd.env == {"HIP_VISIBLE_DEVICES": "1"}
    intel = select_devices(config(backend="xpu", count=1), build_probe(recorded_facts("intel")), environ={})
    assert intel.ok and intel.env == {"ZE_AFFINITY_MASK": "0"}


def test_cross_vendor_capability_never_matches(recorded_facts):
    selection = select_devices(
        config(criteria=[{"min_compute_capability": "sm_80"}]), build_probe(recorded_facts("amd")), environ={}
    )
    assert not selection.ok and selection.devices == []


def test_existing_mask_is_composed_not_replaced(nvidia):
    # The orchestrator already exposed physical GPUs 4,5,7; torch numbers them 0,1,2.
    selection = select_devices(
        config(count=2, criteria=[{"min_memory_gb": 40}]), nvidia, environ={"CUDA_VISIBLE_DEVICES": "4,5,7"}
    )
    assert selection.env == {"CUDA_VISIBLE_DEVICES": "7,5"}
    assert (
        visible_tokens("CUDA_VISIBLE_DEVICES", [0], {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"})
        == "GPU-aaaa"
    )


def test_backend_cpu_hides_devices(nvidia, recorded_facts):
    selection = select_devices(config(backend="cpu"), nvidia, environ={})
    assert selection.ok and selection.env == {"CUDA_VISIBLE_DEVICES": ""}
    intel = select_devices(config(backend="cpu"), build_probe(recorded_facts("intel")), environ={})
    assert intel.env == {} and "cannot be hidden" in intel.notes[0]


def test_auto_on_cpu_without_criteria_is_fine_with_criteria_is_not():
    cpu = build_probe(TorchFacts(torch_version="2.13.0+cpu"))
    assert select_devices(config(), cpu, environ={}).ok
    assert not select_devices(config(criteria=[{"vendor": "nvidia"}]), cpu, environ={}).ok


def test_selection_never_touches_the_process_environment(nvidia, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    select_devices(config(count=1), nvidia)
    import os

    assert "CUDA_VISIBLE_DEVICES" not in os.environ


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"backend": "hip"},
            "accelerator-config.yaml: backend: 'hip' is not one of auto, cuda, rocm, xpu, cpu",
        ),
        ({"count": 0}, "accelerator-config.yaml: count: must be a positive integer"),
        ({"count": True}, "accelerator-config.yaml: count: must be a positive integer"),
        (
            {"criteria": [{"min_compute_capability": "sm8"}]},
            "accelerator-config.yaml: criteria[0].min_compute_capability: 'sm8' is not a valid compute capability",
        ),
        (
            {"criteria": [{"vendor": "apple"}]},
            "accelerator-config.yaml: criteria[0].vendor: 'apple' is not one of",
        ),
        (
            {"criteria": [{"min_memory": 40}]},
            "criteria[0].min_memory: unknown key (did you mean 'min_memory_gb'?",
        ),
        ({"criteria": "sm_80"}, "accelerator-config.yaml: criteria: must be a list of mappings"),
        ({"devices": 2}, "accelerator-config.yaml: devices: unknown key"),
    ],
)
def test_config_validation(data, message):
    with pytest.raises(ConfigError) as info:
        config(**data)
    assert message in str(info.value) and info.value.exit_code == 2


def test_config_location_precedence(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    assert resolve_config_path(None, {"RUNTIME_WORKSPACE": str(ws)}) is None
    (ws / "accelerator-config.yaml").write_text("count: 1\n", encoding="utf-8")
    found = resolve_config_path(None, {"RUNTIME_WORKSPACE": str(ws)})
    assert found is not None and found[0] == ws / "accelerator-config.yaml"
    env_cfg = tmp_path / "env.yaml"
    env_cfg.write_text("count: 2\n", encoding="utf-8")
    env = {"RUNTIME_WORKSPACE": str(ws), "ACCELERATOR_CONFIG": str(env_cfg)}
    loaded = load_accelerator_config(None, env)
    assert loaded is not None and loaded.count == 2
    with pytest.raises(ConfigError, match="from ACCELERATOR_CONFIG"):
        resolve_config_path(None, {"ACCELERATOR_CONFIG": str(tmp_path / "missing.yaml")})
