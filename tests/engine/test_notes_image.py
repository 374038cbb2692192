"""The design notes' files copied verbatim into /workspace of the real cpu image, and the notes'
launcher running the example on this host (a CPU host: the GPU demands must fail cleanly)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.engine

NOTES = Path(__file__).resolve().parents[1] / "fixtures" / "notes"


@pytest.fixture
def cpu_image(cpu_project) -> str:
    return yaml.safe_load((cpu_project / "matrix.yaml").read_text())["registry"] + ":cpu"


def run_with_workspace(engine, image: str, workspace: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    container = engine.client.containers.create(
        image, ["python", "-c", "print('COMMAND RAN')"], environment=env or {},
        volumes={str(workspace): {"bind": "/workspace", "mode": "ro"}},
    )
    try:
        container.start()
        status = container.wait(timeout=300)["StatusCode"]
        return (status, container.logs(stdout=True, stderr=False).decode(),
                container.logs(stdout=False, stderr=True).decode())
    finally:
        container.remove(force=True)


def workspace_with(tmp_path: Path, config: str, spec: str) -> Path:
    """A /workspace holding the notes' files under the names the runtime looks for."""
    ws = tmp_path / "workspace"
    ws.mkdir(mode=0o755)
    shutil.copy(NOTES / config, ws / "accelerator-config.yaml")
    shutil.copy(NOTES / spec, ws / "runtime-spec.yaml")
    return ws


def test_notes_files_verbatim_gpu_demand_fails_with_a_suggestion(engine, cpu_image, tmp_path, no_leftovers):
    ws = workspace_with(tmp_path, "accelerator-config.yaml", "runtime-spec.yaml")
    status, out, err = run_with_workspace(engine, cpu_image, ws)
    assert status == 3, err
    assert "COMMAND RAN" not in out
    assert "[INFO] Loading runtime contract from /workspace/runtime-spec.yaml" in err  # via runtime_contract
    assert "[INFO] Accelerator config: /workspace/accelerator-config.yaml" in err
    assert "[CHECK] gpu_compute_capability: no accelerator (CPU only) -> FAIL" in err
    assert "run on" in err.strip().splitlines()[-1]  # the suggestion


def test_notes_files_without_gpu_demands_pass(engine, cpu_image, tmp_path, no_leftovers):
    ws = workspace_with(tmp_path, "accelerator-config.yaml", "runtime-spec-no-gpu.yaml")
    status, out, err = run_with_workspace(engine, cpu_image, ws)
    assert status == 0, err
    assert out.strip() == "COMMAND RAN"
    assert "[CHECK] pytorch.vendor_agnostic_wheel: 2.13.0+cpu (cpu) -> OK" in err  # against the image's mapping
    assert "no device matched any priority" in err  # the notes' policy on a CPU host: CPU, with a note


def test_notes_rocm_and_amp_keys_each_get_one_warning(engine, cpu_image, tmp_path, no_leftovers):
    ws = workspace_with(tmp_path, "accelerator-config-rocm.yaml", "runtime-spec-no-gpu.yaml")
    status, out, err = run_with_workspace(engine, cpu_image, ws, {"RUNTIME_CHECK_MODE": "warn"})
    assert status == 0, err  # backend rocm on a CPU host: a problem, reported, and warn mode goes on
    assert out.strip() == "COMMAND RAN"
    warnings = [line for line in err.splitlines() if line.startswith("[WARN]")]
    pool = [w for w in warnings if "memory_pool_size_mb" in w]
    assert len(pool) == 1 and "PYTORCH_HIP_ALLOC_CONF" in pool[0]
    assert "backend rocm requested but this host has no AMD" in err


def test_run_experiment_runs_the_example_here(cpu_project, no_leftovers):
    examples = cpu_project / "examples"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "GPU_CONFIG_VENDOR_FILE": str(cpu_project / "no-vendor-file")}
    env.pop("BUILDER_VENDOR", None)
    proc = subprocess.run([str(cpu_project / "scripts" / "run-experiment.sh")], cwd=examples, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "epoch  10" in proc.stdout and "FINAL first_loss=" in proc.stdout
    assert "latest-cpu" in proc.stderr or ":cpu" in proc.stderr
