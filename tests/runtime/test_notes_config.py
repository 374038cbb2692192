"""The design notes' accelerator-config.yaml, accepted as written.

The two files under tests/fixtures/notes/ are copied verbatim from the users'
design notes (comments included) and loaded through the real loader. The
device lists below are constructed stand-ins (names, capabilities and memory
sizes as NVIDIA/AMD/Intel tools report them, driver versions as the host probe
reports them): this machine has no GPU, so nothing here was probed live.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from ml_runtime.devices.capability import amd_capability, intel_capability, nvidia_capability
from ml_runtime.devices.probe import DeviceInfo, ProbeResult
from ml_runtime.errors import ConfigError
from ml_runtime.policy.config import (
    AcceleratorConfig,
    load_accelerator_config,
    looks_like_spec,
    parse_accelerator_config,
)
from ml_runtime.policy.priorities import PolicyCriterion
from ml_runtime.policy.selection import select_devices

NOTES = Path(__file__).resolve().parents[1] / "fixtures" / "notes"
POLICY_FILE = NOTES / "accelerator-config.yaml"
ROCM_FILE = NOTES / "accelerator-config-rocm.yaml"
GB = 10**9


def a100(index: int = 0) -> DeviceInfo:
    return DeviceInfo(index, "NVIDIA A100-SXM4-80GB", "nvidia", nvidia_capability(8, 0), 85 * GB)


def h100(index: int) -> DeviceInfo:
    return DeviceInfo(index, "NVIDIA H100 80GB HBM3", "nvidia", nvidia_capability(9, 0), 85 * GB)


def v100(index: int = 0) -> DeviceInfo:
    return DeviceInfo(index, "Tesla V100-SXM2-32GB", "nvidia", nvidia_capability(7, 0), 34 * GB)


def mi250x(index: int = 0) -> DeviceInfo:
    arch = "gfx90a:sramecc+:xnack-"
    return DeviceInfo(index, "AMD Instinct MI250X", "amd", amd_capability(arch), 68 * GB, arch=arch)


def nvidia_host(*devices: DeviceInfo, driver: str | None = "550.54.15") -> ProbeResult:
    return ProbeResult("nvidia", "cuda", devices=list(devices), driver_version=driver, driver_source="nvml")


def amd_host(*devices: DeviceInfo, driver: str | None = "6.8.5") -> ProbeResult:
    return ProbeResult("amd", "rocm", devices=list(devices), driver_version=driver, driver_source="sysfs")


CPU_HOST = ProbeResult("none", "cpu")


@pytest.fixture
def notes_config() -> AcceleratorConfig:
    config = load_accelerator_config(POLICY_FILE, {})
    assert config is not None
    return config


@pytest.fixture
def rocm_config() -> AcceleratorConfig:
    config = load_accelerator_config(ROCM_FILE, {})
    assert config is not None
    return config


def config(**data) -> AcceleratorConfig:
    return parse_accelerator_config(data, "accelerator-config.yaml")


# ------------------------------------------------------------ the notes' policy file


def test_notes_file_is_accepted_with_every_key_understood(notes_config):
    assert notes_config.backend == "auto"
    assert [e.priority for e in notes_config.policy] == [1, 2]
    first, second = notes_config.policy
    assert [(c.type, c.op) for c in first.criteria] == [
        ("gpu_compute_capability", "min"),
        ("driver_version", "min"),
    ]
    assert first.criteria[0].value.text == "sm_80" and first.criteria[1].value == "535.54.03"
    assert second.criteria == (PolicyCriterion("gpu_vendor", "equals", "amd"),)
    assert notes_config.runtime_contract == NOTES / "runtime-spec.yaml"  # relative to the config's directory
    assert notes_config.warnings == () and dict(notes_config.env) == {}


def test_a100_with_a_current_driver_takes_priority_1(notes_config):
    selection = select_devices(notes_config, nvidia_host(v100(0), a100(1), h100(2)), environ={})
    assert selection.ok and selection.priority == 1
    assert [d.index for d in selection.devices] == [2, 1]  # newest architecture first, V100 left out
    assert selection.env == {"CUDA_VISIBLE_DEVICES": "2,1"}
    assert selection.lines()[0] == (
        "[SELECT] priority 1 (gpu_compute_capability >= sm_80, driver_version >= 535.54.03): "
        "devices 2 NVIDIA H100 80GB HBM3 (sm_90), 1 NVIDIA A100-SXM4-80GB (sm_80) -> CUDA_VISIBLE_DEVICES=2,1"
    )
    data = selection.to_dict()
    assert data["priority"] == 1 and data["warnings"] == []


def test_driver_comparison_is_numeric_not_textual(notes_config):
    # 535.104.05 > 535.54.03 although "104" < "54" as text.
    assert select_devices(notes_config, nvidia_host(a100(), driver="535.104.05"), environ={}).priority == 1
    assert select_devices(notes_config, nvidia_host(a100(), driver="535.54.03"), environ={}).priority == 1


def test_v100_matches_no_priority_and_is_a_problem(notes_config):
    selection = select_devices(notes_config, nvidia_host(v100()), environ={})
    assert not selection.ok and selection.priority is None and selection.devices == []
    assert selection.env == {}
    (problem,) = selection.problems
    assert problem.startswith("no device matches any priority of device_selection_policy: ")
    assert "priority 1 (gpu_compute_capability >= sm_80, driver_version >= 535.54.03): device 0:" in problem
    assert "priority 2 (gpu_vendor = amd): device 0: requires an AMD GPU but found NVIDIA" in problem
    assert "found: 0 Tesla V100-SXM2-32GB (sm_70), driver 550.54.15" in problem
    assert "\n" not in problem


def test_old_driver_fails_priority_1_on_an_a100(notes_config):
    selection = select_devices(notes_config, nvidia_host(a100(), driver="470.82.01"), environ={})
    assert not selection.ok
    assert "requires driver >= 535.54.03 but found 470.82.01" in selection.problems[0]


def test_unknown_driver_does_not_satisfy_and_says_so(notes_config):
    selection = select_devices(notes_config, nvidia_host(a100(), driver=None), environ={})
    assert not selection.ok and "driver version is unknown" in selection.problems[0]
    assert any("driver version could not be determined" in n for n in selection.notes)


def test_amd_host_takes_priority_2(notes_config):
    selection = select_devices(notes_config, amd_host(mi250x(0), mi250x(1)), environ={})
    assert selection.ok and selection.priority == 2 and selection.backend == "rocm"
    assert selection.env == {"HIP_VISIBLE_DEVICES": "0,1"}
    # Why priority 1 was passed over is reported, not silent.
    assert selection.notes[0].startswith("skipped priority 1 (gpu_compute_capability >= sm_80")


def test_cpu_only_host_runs_on_cpu_with_a_note(notes_config):
    selection = select_devices(notes_config, CPU_HOST, environ={})
    assert selection.ok and selection.backend == "cpu" and selection.env == {}
    assert selection.notes == ["no device matched any priority; this host has no accelerator: running on CPU"]
    # The compact criteria keep their stricter meaning.
    assert not select_devices(config(criteria=[{"vendor": "amd"}]), CPU_HOST, environ={}).ok


def test_count_applies_on_top_of_the_winning_priority(notes_config):
    policy = [{"priority": 1, "criteria": [{"type": "gpu_compute_capability", "min": "sm_80"}]}]
    host = nvidia_host(a100(0), h100(1), a100(2))
    one = select_devices(config(device_selection_policy=policy, count=1), host, environ={})
    assert one.ok and one.env == {"CUDA_VISIBLE_DEVICES": "1"}
    four = select_devices(config(device_selection_policy=policy, count=4), host, environ={})
    assert four.problems == [
        "only 3 of the requested 4 devices satisfy priority 1 (gpu_compute_capability >= sm_80)"
    ]


def test_first_matching_priority_wins_even_if_a_later_one_matches_more():
    policy = [
        {"priority": 2, "criteria": [{"type": "memory_gb", "min": 40}]},
        {
            "priority": 1,
            "criteria": [{"type": "name", "equals": "h100"}],
        },  # order in the file does not matter
    ]
    selection = select_devices(
        config(device_selection_policy=policy),
        nvidia_host(a100(0), h100(1)),
        environ={"CUDA_VISIBLE_DEVICES": "4,6"},
    )
    assert selection.priority == 1 and selection.env == {"CUDA_VISIBLE_DEVICES": "6"}


def test_capability_equals_and_cross_vendor():
    equals = [{"priority": 1, "criteria": [{"type": "gpu_compute_capability", "equals": "sm_80"}]}]
    assert select_devices(
        config(device_selection_policy=equals), nvidia_host(a100(0), h100(1)), environ={}
    ).env == {"CUDA_VISIBLE_DEVICES": "0"}
    gfx = [{"priority": 1, "criteria": [{"type": "gpu_compute_capability", "min": "gfx90a"}]}]
    assert not select_devices(config(device_selection_policy=gfx), nvidia_host(h100(0)), environ={}).ok
    assert select_devices(config(device_selection_policy=gfx), amd_host(mi250x()), environ={}).ok


def test_vendor_aliases_and_intel():
    intel = ProbeResult(
        "intel",
        "xpu",
        devices=[
            DeviceInfo(0, "Intel(R) Data Center GPU Max 1550", "intel", intel_capability(0x0BD5), 128 * GB)
        ],
    )
    policy = [{"priority": 1, "criteria": [{"type": "gpu_vendor", "equals": "oneAPI"}]}]
    cfg = config(backend="oneapi", device_selection_policy=policy)
    assert cfg.backend == "xpu" and cfg.policy[0].criteria[0].value == "intel"
    selection = select_devices(cfg, intel, environ={})
    assert selection.ok and selection.env == {"ZE_AFFINITY_MASK": "0"}


def test_compact_format_is_unchanged():
    selection = select_devices(
        config(backend="auto", criteria=[{"min_compute_capability": "sm_80"}], count=1),
        nvidia_host(a100(0), h100(1)),
        environ={},
    )
    assert selection.priority is None and selection.env == {"CUDA_VISIBLE_DEVICES": "1"}
    assert selection.lines()[0].startswith("[SELECT] backend cuda: devices 1 NVIDIA H100")


# ------------------------------------------------------------ rocm_config / amp_config


def test_rocm_notes_file_on_an_amd_host(rocm_config):
    assert rocm_config.backend == "rocm"
    selection = select_devices(rocm_config, amd_host(mi250x(0), mi250x(1)), environ={})
    assert selection.ok
    assert selection.env == {"HIP_VISIBLE_DEVICES": "0,1", "ACCELERATE_MIXED_PRECISION": "fp16"}
    assert "HSA_XNACK" not in selection.env  # use_unified_memory: false
    (warning,) = selection.warnings
    assert "memory_pool_size_mb (16384) has no effect" in warning
    assert "PYTORCH_HIP_ALLOC_CONF" in warning and "HIP_MEMORY_POOL_SIZE" in warning
    assert "hipMallocManaged" in warning and "\n" not in warning and not warning.startswith("[")


def test_unified_memory_sets_xnack_on_rocm_only(tmp_path):
    text = ROCM_FILE.read_text(encoding="utf-8").replace(
        "use_unified_memory: false", "use_unified_memory: true"
    )
    path = tmp_path / "accelerator-config.yaml"
    path.write_text(text, encoding="utf-8")
    cfg = load_accelerator_config(str(path), {})
    assert cfg is not None
    selection = select_devices(cfg, amd_host(mi250x()), environ={})
    assert selection.env["HSA_XNACK"] == "1"
    auto = parse_accelerator_config({"rocm_config": {"use_unified_memory": True}}, "a.yaml")
    on_nvidia = select_devices(auto, nvidia_host(a100()), environ={})
    assert "HSA_XNACK" not in on_nvidia.env
    assert on_nvidia.warnings == [
        (
            "rocm_config.use_unified_memory only applies to ROCm (it sets HSA_XNACK=1); "
            "the selected backend is cuda, so it has no effect."
        )
    ]


def test_xnack_on_a_gpu_without_xnack_warns():
    rdna = DeviceInfo(0, "AMD Radeon RX 7900 XTX", "amd", amd_capability("gfx1100"), 24 * GB, arch="gfx1100")
    cfg = config(rocm_config={"use_unified_memory": True})
    selection = select_devices(cfg, amd_host(rdna), environ={})
    assert selection.env["HSA_XNACK"] == "1"
    assert any("does not support XNACK" in w for w in selection.warnings)


def test_launch_environment_wins_over_the_file(rocm_config):
    selection = select_devices(
        rocm_config, amd_host(mi250x()), environ={"ACCELERATE_MIXED_PRECISION": "bf16"}
    )
    assert "ACCELERATE_MIXED_PRECISION" not in selection.env
    assert any(w.startswith("ACCELERATE_MIXED_PRECISION=bf16 is already set") for w in selection.warnings)


@pytest.mark.parametrize(
    ("amp", "mixed", "warning"),
    [
        ({"dtype": "bfloat16"}, "bf16", None),
        ({"dtype": "bf16", "grad_scaler": True}, "bf16", "bf16 needs no loss scaling"),
        ({"dtype": "half", "grad_scaler": False}, "fp16", "always scales float16 gradients"),
        ({"dtype": "float32"}, "no", None),
        ({"dtype": False}, "no", None),  # YAML reads an unquoted `no` as false
        ({"dtype": "fp16", "backend": "apex"}, "fp16", "'apex' has no effect: Accelerate always uses"),
        ({"dtype": "fp16", "backend": "native", "grad_scaler": True}, "fp16", None),
    ],
)
def test_amp_config_maps_onto_accelerate(amp, mixed, warning):
    cfg = config(amp_config=amp)
    assert cfg.env == {"ACCELERATE_MIXED_PRECISION": mixed}
    selection = select_devices(cfg, nvidia_host(a100()), environ={})
    assert selection.env["ACCELERATE_MIXED_PRECISION"] == mixed
    if warning is None:
        assert selection.warnings == []
    else:
        (text,) = selection.warnings
        assert warning in text


def test_fp16_is_not_set_on_cpu(rocm_config):
    cfg = config(amp_config={"dtype": "float16"})
    selection = select_devices(cfg, CPU_HOST, environ={})
    assert selection.ok and selection.env == {}
    assert "float16 has no effect on CPU" in selection.warnings[0]
    bf16 = select_devices(config(amp_config={"dtype": "bf16"}), CPU_HOST, environ={})
    assert bf16.env == {"ACCELERATE_MIXED_PRECISION": "bf16"}


# ------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {
                "criteria": [{"vendor": "nvidia"}],
                "device_selection_policy": [{"priority": 1, "criteria": []}],
            },
            "accelerator-config.yaml: criteria and device_selection_policy cannot be combined; use one",
        ),
        (
            {"device_selection_policy": {"priority": 1}},
            "accelerator-config.yaml: device_selection_policy: must be a list",
        ),
        ({"device_selection_policy": []}, "device_selection_policy: is empty"),
        ({"device_selection_policy": [{"criteria": []}]}, "device_selection_policy[0]: priority is missing"),
        (
            {"device_selection_policy": [{"priority": 0, "criteria": []}]},
            "device_selection_policy[0].priority: must be a positive integer, not 0",
        ),
        (
            {"device_selection_policy": [{"priority": "1", "criteria": []}]},
            "device_selection_policy[0].priority: must be a positive integer, not '1'",
        ),
        (
            {"device_selection_policy": [{"priority": 1, "criteria": []}, {"priority": 1, "criteria": []}]},
            "device_selection_policy[1].priority: 1 is already used by device_selection_policy[0]",
        ),
        ({"device_selection_policy": [{"priority": 1}]}, "device_selection_policy[0]: criteria is missing"),
        (
            {"device_selection_policy": [{"priority": 1, "criterias": []}]},
            "device_selection_policy[0].criterias: unknown key (did you mean 'criteria'?",
        ),
        (
            {
                "device_selection_policy": [
                    {"priority": 1, "criteria": [{"type": "gpu_arch", "min": "sm_80"}]}
                ]
            },
            (
                "device_selection_policy[0].criteria[0].type: 'gpu_arch' is not a criterion type "
                "(allowed: gpu_compute_capability, driver_version, gpu_vendor, memory_gb, device_memory_gb, name)"
            ),
        ),
        (
            {
                "device_selection_policy": [
                    {"priority": 1, "criteria": [{"type": "driver_versoin", "min": "1"}]}
                ]
            },
            "criteria[0].type: 'driver_versoin' is not a criterion type (did you mean 'driver_version'?",
        ),
        (
            {"device_selection_policy": [{"priority": 1, "criteria": [{"type": "driver_version"}]}]},
            "device_selection_policy[0].criteria[0]: driver_version needs min",
        ),
        (
            {
                "device_selection_policy": [
                    {
                        "priority": 1,
                        "criteria": [{"type": "gpu_compute_capability", "min": "sm_80", "equals": "sm_80"}],
                    }
                ]
            },
            "device_selection_policy[0].criteria[0]: give either min or equals, not both",
        ),
        (
            {
                "device_selection_policy": [
                    {"priority": 1, "criteria": [{"type": "gpu_vendor", "min": "amd"}]}
                ]
            },
            "device_selection_policy[0].criteria[0].min: gpu_vendor takes equals, not min",
        ),
        (
            {
                "device_selection_policy": [
                    {"priority": 1, "criteria": [{"type": "gpu_vendor", "equals": "apple"}]}
                ]
            },
            "device_selection_policy[0].criteria[0].equals: 'apple' is not one of nvidia, amd, intel",
        ),
        (
            {
                "device_selection_policy": [
                    {"priority": 1, "criteria": [{"type": "gpu_compute_capability", "min": "sm8"}]}
                ]
            },
            "device_selection_policy[0].criteria[0].min: 'sm8' is not a valid compute capability",
        ),
        (
            {
                "device_selection_policy": [
                    {"priority": 1, "criteria": [{"type": "driver_version", "min": 535.5}]}
                ]
            },
            'device_selection_policy[0].criteria[0].min: quote the version, e.g. "535.5"',
        ),
        (
            {"device_selection_policy": [{"priority": 1, "criteria": [{"type": "memory_gb", "min": -1}]}]},
            "device_selection_policy[0].criteria[0].min: must be a positive number of GB",
        ),
        (
            {"device_selection_policy": [{"priority": 1, "criteria": [{"type": "name", "max": "H100"}]}]},
            "device_selection_policy[0].criteria[0].max: unknown key",
        ),
        ({"backend": "hip"}, "backend: 'hip' is not one of auto, cuda, rocm, xpu, cpu (or oneapi for xpu)"),
        (
            {"runtime_contract": ""},
            "accelerator-config.yaml: runtime_contract: must be a non-empty path string",
        ),
        ({"runtime_contract": 3}, "runtime_contract: must be a non-empty path string"),
        (
            {"rocm_config": {"memory_pool_size": 1}},
            (
                "rocm_config.memory_pool_size: unknown key (did you mean 'memory_pool_size_mb'? "
                "allowed: memory_pool_size_mb, use_unified_memory)"
            ),
        ),
        (
            {"rocm_config": {"use_unified_memory": "yes"}},
            "rocm_config.use_unified_memory: must be true or false",
        ),
        (
            {"rocm_config": {"memory_pool_size_mb": 0}},
            "rocm_config.memory_pool_size_mb: must be a positive integer",
        ),
        ({"amp_config": {"dtype": "fp8"}}, "amp_config.dtype: 'fp8' is not one of float16"),
        ({"amp_config": {"backend": "native"}}, "amp_config: dtype is missing"),
        ({"amp_config": {"dtype": "fp16", "scaler": True}}, "amp_config.scaler: unknown key"),
        (
            {"amp_config": {"dtype": "fp16", "grad_scaler": "on"}},
            "amp_config.grad_scaler: must be true or false",
        ),
        ({"amp_config": "fp16"}, "amp_config: must be a mapping of backend, dtype, grad_scaler"),
        (
            {"device_selecton_policy": []},
            "device_selecton_policy: unknown key (did you mean 'device_selection_policy'?",
        ),
    ],
)
def test_validation_is_one_line_and_names_the_key(data, message):
    with pytest.raises(ConfigError) as info:
        config(**data)
    text = str(info.value)
    assert message in text and "\n" not in text and info.value.exit_code == 2
    assert text.startswith("accelerator-config.yaml: ")


def test_fixture_errors_name_the_file(tmp_path):
    broken = tmp_path / "accelerator-config.yaml"
    shutil.copy(POLICY_FILE, broken)
    broken.write_text(
        broken.read_text(encoding="utf-8").replace('equals: "amd"', 'equals: "arm"'), encoding="utf-8"
    )
    with pytest.raises(
        ConfigError, match=r"device_selection_policy\[1\]\.criteria\[0\]\.equals: 'arm'"
    ) as info:
        load_accelerator_config(str(broken), {})
    assert str(info.value).startswith(f"{broken}: ")


def test_looks_like_spec():
    assert looks_like_spec({"required_features": [], "dependencies": [], "mode": "strict"})
    assert not looks_like_spec({"backend": "auto", "required_features": []})
    assert not looks_like_spec({"device_selection_policy": []})
