"""runtime-spec.yaml: the accepted format, validation messages, precedence, modes."""

from __future__ import annotations

from pathlib import Path

import pytest
from ml_runtime.contract.fields import load_yaml_mapping
from ml_runtime.contract.locate import load_spec, resolve_spec_path
from ml_runtime.contract.spec import DEFAULT_SPEC_PATH, env_mode, resolve_mode
from ml_runtime.contract.spec_file import parse_spec
from ml_runtime.devices.capability import Capability
from ml_runtime.errors import ConfigError

# The format exactly as users write it today (comments included).
USER_SPEC = """\
required_features:
  - gpu_compute_capability: "sm_80"   # or "gfx90a" (AMD), or an Intel family/device id
  - memory_bandwidth_gbps: 2000        # or "auto": measure it
  - driver_version_min: "535.54.03"
  - device_memory_gb: 40               # minimum device memory (add this key)
dependencies:
  - name: pytorch
    version_range: ">=2.1.0,<2.2.0"
    full_distribution: true            # torch.distributed must be available
mode: strict   # strict | warn | off ; env RUNTIME_CHECK_MODE overrides the file, --mode overrides both
"""


def spec_from(tmp_path: Path, text: str, name: str = "runtime-spec.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return parse_spec(load_yaml_mapping(path, name), name)


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        spec_from(tmp_path, text)
    assert info.value.exit_code == 2
    message = str(info.value)
    assert "\n" not in message, "validation errors are one line"
    return message


def test_user_format_is_accepted_as_written(tmp_path):
    spec = spec_from(tmp_path, USER_SPEC)
    assert list(spec.features) == [
        "gpu_compute_capability",
        "memory_bandwidth_gbps",
        "driver_version_min",
        "device_memory_gb",
    ]
    cap = spec.features["gpu_compute_capability"]
    assert isinstance(cap, Capability) and (cap.vendor, cap.version) == ("nvidia", (8, 0))
    assert spec.features["memory_bandwidth_gbps"] == 2000.0
    assert spec.features["driver_version_min"].for_vendor("nvidia") == "535.54.03"
    assert spec.features["device_memory_gb"] == 40.0
    (dep,) = spec.dependencies
    assert dep.is_torch and dep.full_distribution and dep.range_text == ">=2.1.0,<2.2.0"
    assert spec.mode == "strict"


def test_auto_bandwidth_and_per_vendor_driver_minimums(tmp_path):
    spec = spec_from(
        tmp_path,
        "required_features:\n  - memory_bandwidth_gbps: auto\n"
        '  - driver_version_min: {nvidia: "535.54.03", amd: "6.8.5"}\n',
    )
    assert spec.features["memory_bandwidth_gbps"] == "auto"
    assert spec.features["driver_version_min"].for_vendor("amd") == "6.8.5"
    assert spec.features["driver_version_min"].for_vendor("intel") is None


def test_empty_file_means_no_requirements(tmp_path):
    spec = spec_from(tmp_path, "# nothing required\n")
    assert spec.features == {} and spec.dependencies == () and spec.mode == "strict"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'required_features:\n  - gpu_compute_capability: "sm8"\n',
            (
                "runtime-spec.yaml: required_features[0].gpu_compute_capability: 'sm8' is not a valid "
                "compute capability (expected sm_XY, gfxNNN[a-z] or an Intel family"
            ),
        ),
        (
            'required_features:\n  - device_memory_gb: 40\n  - gpu_compute_capability: "gfx9"\n',
            "runtime-spec.yaml: required_features[1].gpu_compute_capability: 'gfx9' is not a valid",
        ),
        (
            "required_features:\n  - gpu_compute_capabilty: sm_80\n",
            (
                "runtime-spec.yaml: required_features[0].gpu_compute_capabilty: unknown key "
                "(did you mean 'gpu_compute_capability'?"
            ),
        ),
        ("requirements: []\n", "runtime-spec.yaml: requirements: unknown key"),
        (
            "dependencies:\n  - name: pytorch\n    versoin_range: '>=2'\n",
            "runtime-spec.yaml: dependencies[0].versoin_range: unknown key (did you mean 'version_range'?",
        ),
        (
            "required_features:\n  - device_memory_gb: forty\n",
            "runtime-spec.yaml: required_features[0].device_memory_gb: must be a positive number",
        ),
        (
            "required_features:\n  - device_memory_gb: true\n",
            "runtime-spec.yaml: required_features[0].device_memory_gb: must be a positive number",
        ),
        (
            "required_features:\n  - memory_bandwidth_gbps: fast\n",
            'required_features[0].memory_bandwidth_gbps: must be a positive number of GB/s or "auto"',
        ),
        (
            "required_features:\n  - driver_version_min: 535.50\n",
            "required_features[0].driver_version_min: quote the version",
        ),
        (
            "required_features:\n  - driver_version_min: 'r535'\n",
            "required_features[0].driver_version_min: 'r535' is not a dotted numeric version",
        ),
        (
            "required_features:\n  - driver_version_min: {nvdia: '535'}\n",
            "required_features[0].driver_version_min.nvdia: unknown vendor",
        ),
        (
            "required_features:\n  - device_memory_gb: 40\n  - device_memory_gb: 80\n",
            "required_features[1].device_memory_gb: device_memory_gb is given more than once",
        ),
        ("required_features: sm_80\n", "runtime-spec.yaml: required_features: must be a list of mappings"),
        ("required_features:\n  - sm_80\n", "runtime-spec.yaml: required_features[0]: must be a mapping"),
        ("dependencies:\n  - version_range: '>=2'\n", "dependencies[0].name: required"),
        (
            "dependencies:\n  - name: pytorch\n    version_range: '>>2'\n",
            "dependencies[0].version_range: '>>2' is not a valid version range",
        ),
        (
            "dependencies:\n  - name: pytorch\n    version_range: 2.1\n",
            "dependencies[0].version_range: must be a quoted string",
        ),
        (
            "dependencies:\n  - name: numpy\n    full_distribution: true\n",
            "dependencies[0].full_distribution: only supported for pytorch",
        ),
        (
            "dependencies:\n  - name: pytorch\n    full_distribution: 'yes'\n",
            "dependencies[0].full_distribution: must be true or false",
        ),
        ("mode: loud\n", "runtime-spec.yaml: mode: 'loud' is not one of strict, warn, off"),
        ("- just a list\n", "runtime-spec.yaml: the top level must be a mapping, not a list"),
        ("mode: [strict\n", "runtime-spec.yaml: invalid YAML at line"),
    ],
)
def test_validation_errors_name_file_and_key(tmp_path, text, expected):
    message = error_of(tmp_path, text)
    assert message.startswith("runtime-spec.yaml: ")
    assert expected in message


def test_compute_capability_forms(tmp_path):
    for text, vendor in [
        ("sm_90a", "nvidia"),
        ("SM_120", "nvidia"),
        ("gfx90a", "amd"),
        ("gfx1100", "amd"),
        ("pvc", "intel"),
        ("0x0BD5", "intel"),
    ]:
        spec = spec_from(tmp_path, f'required_features:\n  - gpu_compute_capability: "{text}"\n')
        assert spec.features["gpu_compute_capability"].vendor == vendor


def test_precedence_cli_over_env_over_workspace_over_default(tmp_path, workspace):
    ws_spec = workspace / "runtime-spec.yaml"
    env_spec = tmp_path / "env.yaml"
    cli_spec = tmp_path / "cli.yaml"
    for path, mode in [(ws_spec, "warn"), (env_spec, "off"), (cli_spec, "strict")]:
        path.write_text(f"mode: {mode}\n", encoding="utf-8")

    env = {"RUNTIME_WORKSPACE": str(workspace)}
    assert load_spec(None, {"RUNTIME_WORKSPACE": str(tmp_path / "none")}).source == str(DEFAULT_SPEC_PATH)
    assert load_spec(None, env).mode == "warn"
    assert load_spec(None, {**env, "RUNTIME_SPEC": str(env_spec)}).mode == "off"
    assert load_spec(str(cli_spec), {**env, "RUNTIME_SPEC": str(env_spec)}).mode == "strict"


def test_missing_explicit_spec_files_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="from --spec"):
        resolve_spec_path(str(tmp_path / "nope.yaml"), {})
    with pytest.raises(ConfigError, match="from RUNTIME_SPEC"):
        resolve_spec_path(None, {"RUNTIME_SPEC": str(tmp_path / "nope.yaml")})


def test_mode_precedence_and_bad_env_value():
    assert resolve_mode(None, "strict", {}) == "strict"
    assert resolve_mode(None, "strict", {"RUNTIME_CHECK_MODE": "warn"}) == "warn"
    assert resolve_mode("off", "strict", {"RUNTIME_CHECK_MODE": "warn"}) == "off"
    assert env_mode({"RUNTIME_CHECK_MODE": " Strict "}) == "strict"
    with pytest.raises(ConfigError, match="RUNTIME_CHECK_MODE: 'loud' is not one of strict, warn, off"):
        env_mode({"RUNTIME_CHECK_MODE": "loud"})


def test_packaged_default_spec_is_cpu_friendly():
    spec = load_spec(None, {"RUNTIME_WORKSPACE": "/nonexistent"})
    assert spec.features == {}
    (dep,) = spec.dependencies
    assert dep.is_torch and dep.full_distribution
    assert dep.version_range is not None and dep.version_range.contains("2.0.0") and dep.version_range.contains("2.13.0")
    assert spec.mode == "strict"


def test_unquoted_off_is_mode_off(tmp_path):
    # YAML 1.1 turns a bare `off` into false; users write it bare.
    assert spec_from(tmp_path, "mode: off\n").mode == "off"
    assert "mode: True is not one of" in error_of(tmp_path, "mode: on\n")
