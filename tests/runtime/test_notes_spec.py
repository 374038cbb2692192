"""The design notes' runtime-spec.yaml, runtime-checker and Python helpers, fed verbatim.

The spec files are the notes' own (tests/fixtures/notes/). Subprocess tests run the runtime from
source with the real torch of this machine, shown no accelerator where the test means a CPU host
(conftest.NO_ACCELERATOR: they hold on a GPU host too). GPU devices are stand-ins built in the test;
the recorded NVIDIA outputs come from tests/runtime/fixtures/.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ml_runtime import get_device, get_gpu_metrics
from ml_runtime.contract.checks import check_capability
from ml_runtime.contract.locate import load_spec
from ml_runtime.contract.packages import check_wheel
from ml_runtime.contract.spec import Dependency
from ml_runtime.devices.capability import intel_capability, parse_capability
from ml_runtime.devices.probe import DeviceInfo, ProbeResult

NOTES = Path(__file__).resolve().parents[1] / "fixtures" / "notes"
CHECKER = "import sys; from ml_runtime.cli import checker_main; sys.exit(checker_main(sys.argv[1:]))"


@pytest.fixture
def no_gpu_spec(tmp_path: Path) -> tuple[Path, str]:
    """The notes' spec without GPU demands, its version range this host's torch (the fixture names the
    images' torch): (the file, the range)."""
    import torch
    from packaging.version import Version

    wanted = f">={Version(torch.__version__).public}"
    spec = tmp_path / "runtime-spec-no-gpu.yaml"
    spec.write_text((NOTES / "runtime-spec-no-gpu.yaml").read_text().replace('">=2.13.0"', f'"{wanted}"'))
    return spec, wanted


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


# 1. The notes' runtime-spec.yaml is accepted, vendor_agnostic_wheel included.
def test_notes_spec_loads_as_written():
    spec = load_spec(str(NOTES / "runtime-spec.yaml"))
    assert list(spec.features) == ["gpu_compute_capability", "memory_bandwidth_gbps", "driver_version_min"]
    (torch,) = spec.dependencies
    assert torch.is_torch and torch.vendor_agnostic_wheel and torch.range_text == ">=2.1.0,<2.2.0"


def test_notes_spec_on_a_cpu_host_stops_the_command_with_a_suggestion(cli_env, workspace, no_accelerator):
    cli_env = {**cli_env, **no_accelerator}
    proc = run(["-m", "ml_runtime", "exec", "--spec", str(NOTES / "runtime-spec.yaml"), "--",
                sys.executable, "-c", "print('COMMAND RAN')"], cli_env, workspace)
    assert proc.returncode == 3, proc.stderr
    assert "COMMAND RAN" not in proc.stdout
    assert f"[INFO] Loading runtime contract from {NOTES / 'runtime-spec.yaml'}" in proc.stderr
    assert "[CHECK] gpu_compute_capability: no accelerator (CPU only) -> FAIL" in proc.stderr
    import torch

    (wheel,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("[CHECK] pytorch.vendor_agnostic_wheel:")]
    assert wheel.startswith(f"[CHECK] pytorch.vendor_agnostic_wheel: {torch.__version__} (") and wheel.endswith("-> OK")
    assert "run on" in proc.stderr.splitlines()[-1]  # the suggestion


def test_spec_without_gpu_demands_passes_and_runs(cli_env, workspace, no_accelerator, no_gpu_spec):
    cli_env = {**cli_env, **no_accelerator}
    proc = run(["-m", "ml_runtime", "exec", "--spec", str(no_gpu_spec[0]), "--",
                sys.executable, "-c", "print('COMMAND RAN')"], cli_env, workspace)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "COMMAND RAN"
    # gloo, the CPU's backend, is required; a CUDA build also lists the nccl it was compiled with.
    assert "[CHECK] pytorch.full_distribution: torch.distributed (gloo" in proc.stderr


def test_vendor_agnostic_wheel_compares_with_the_images_wheel_mapping():
    dep = Dependency("pytorch", None, False, "dependencies[0]", vendor_agnostic_wheel=True)
    cu130 = ProbeResult("nvidia", "cuda", torch={"version": "2.14.1+cu130", "flavour": "cuda 13.0"})
    mapped = {"ML_RUNTIME_TORCH": "2.14.1", "ML_RUNTIME_FLAVOUR": "cuda 13.0"}
    assert check_wheel(dep, cu130, mapped).ok  # PyPI's default build: +cu130 only inside torch
    assert not check_wheel(dep, cu130, {**mapped, "ML_RUNTIME_FLAVOUR": "cuda 12.8"}).ok
    assert not check_wheel(dep, cu130, {**mapped, "ML_RUNTIME_TORCH": "2.13.0+cpu"}).ok
    # Outside an image of ours: any official index build passes, a vendor fork does not.
    assert check_wheel(dep, cu130, {}).ok
    ngc = ProbeResult("nvidia", "cuda", torch={"version": "2.5.0a0+872d972e41.nv24.08", "flavour": "cuda 12.6"})
    result = check_wheel(dep, ngc, {})
    assert not result.ok and "vendor build" in (result.reason or "")


# 3. runtime-checker: the notes' name, flags (--config = the spec) and report format.
def test_runtime_checker_reports_in_the_notes_format(cli_env, workspace, no_accelerator, no_gpu_spec):
    import torch

    cli_env = {**cli_env, **no_accelerator}
    spec, wanted = no_gpu_spec
    proc = run(["-c", CHECKER, "--config", str(spec)], cli_env, workspace)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"[INFO] Loading runtime contract from {spec}"
    assert lines[1] == "[INFO] Accelerator config: none (all devices)"
    assert f"[CHECK] PyTorch version: {torch.__version__} -> OK (required: pytorch {wanted})" in lines
    assert lines[-1] == "[SUCCESS] All checks passed. Environment is compatible."


def test_runtime_checker_failure_is_an_error_line_with_a_suggestion(cli_env, workspace, no_accelerator):
    cli_env = {**cli_env, **no_accelerator}
    proc = run(["-c", CHECKER, "--config", str(NOTES / "runtime-spec.yaml")], cli_env, workspace)
    assert proc.returncode == 3
    errors = [line for line in proc.stdout.splitlines() if line.startswith("[ERROR]")]
    assert errors[0].startswith("[ERROR] GPU compute capability mismatch: Required: an NVIDIA GPU")
    assert "Found: no accelerator (CPU only) Suggestion: " in errors[0]
    assert "[SUCCESS]" not in proc.stdout


def test_spec_passed_as_accelerator_config_says_use_spec(cli_env, workspace):
    spec = NOTES / "runtime-spec.yaml"
    proc = run(["-m", "ml_runtime", "check", "--config", str(spec)], cli_env, workspace)
    assert proc.returncode == 2
    expected = (
        f"{spec}: this is a runtime spec (required_features/dependencies), not an accelerator config: "
        f"pass it with --spec {spec} (--config takes accelerator-config.yaml; the notes' runtime-checker "
        "--config takes the spec)"
    )
    assert proc.stderr.strip().splitlines() == [expected]


# 4. Intel's architecture name from the notes' comment.
def test_xe_hpg_is_the_dg2_family():
    spec = load_spec(str(NOTES / "runtime-spec-xe-hpg.yaml"))
    required = spec.features["gpu_compute_capability"]
    assert required == parse_capability("dg2") and required.vendor == "intel"
    flex = DeviceInfo(0, "Intel(R) Data Center GPU Flex 170", "intel", intel_capability(0x56C0))
    assert check_capability(required, ProbeResult("intel", "xpu", devices=[flex]), [flex]).ok


# 6. get_device() and get_gpu_metrics() with the notes' field names.
def test_get_device_is_cpu_without_an_accelerator(cli_env, workspace, no_accelerator):
    code = "from ml_runtime import get_device; print(get_device())"
    proc = run(["-c", code], {**cli_env, **no_accelerator}, workspace)
    assert proc.stdout.strip() == "cpu", proc.stderr


def test_get_device_is_what_torch_sees_here():
    import torch

    expected = "cuda" if torch.cuda.is_available() else "xpu" if torch.xpu.is_available() else "cpu"
    assert get_device() == torch.device(expected)


def test_get_gpu_metrics_uses_the_notes_field_names(fixture_text, monkeypatch):
    from ml_runtime.devices.tools import ToolResult

    monkeypatch.setitem(sys.modules, "pynvml", None)  # the recorded nvidia-smi answers instead

    def runner(argv):
        if argv[0] == "nvidia-smi":
            return ToolResult(True, fixture_text("nvidia-smi_query.csv"))
        return ToolResult(False, "", f"{argv[0]} not found on PATH")

    metrics = get_gpu_metrics(runner)
    assert metrics, "the recorded nvidia-smi output names devices"
    first = metrics[0]
    assert set(first) == {"index", "gpu_vendor", "gpu_model", "gpu_util_percent", "gpu_temp_c",
                          "gpu_mem_used_mb", "gpu_mem_total_mb", "source"}
    assert first["gpu_vendor"] == "nvidia" and first["gpu_model"]
    assert first["gpu_mem_total_mb"] is not None and first["gpu_mem_total_mb"] > 1000


@pytest.mark.parametrize("forbidden", ["torch.hip", "rccl", "\"rocm\"", "intel_extension_for_pytorch"])
def test_helpers_never_use_the_notes_wrong_names(forbidden):
    path = sys.modules["ml_runtime.api"].__file__
    assert path is not None
    source = Path(path).read_text()
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("#", ">>>")))
    doc_free = code.split('"""')[::2]  # outside docstrings
    assert all(forbidden not in part for part in doc_free)
