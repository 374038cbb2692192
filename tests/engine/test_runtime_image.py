"""The in-image runtime in the real cpu image (testcontainers, reaper disabled): the default
contract passes and the command runs; an sm_80 contract stops it with exit 3; the probe
describes the CPU; `builder run` picks the cpu image here and returns the command's status."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import yaml
from helpers import run_builder
from testcontainers.core.container import DockerContainer

pytestmark = pytest.mark.engine


@pytest.fixture
def cpu_image(cpu_project) -> str:
    return yaml.safe_load((cpu_project / "matrix.yaml").read_text())["registry"] + ":cpu"


def run_in(
    image: str, command: str, volumes: Sequence[tuple[str, str]] = (), env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    container = DockerContainer(image).with_command(command)
    for key, value in (env or {}).items():
        container = container.with_env(key, value)
    for host, path in volumes:
        container = container.with_volume_mapping(host, path, "ro")
    container.start()
    try:
        status = container.get_wrapped_container().wait(timeout=300)["StatusCode"]
        out, err = container.get_logs()
        return status, out.decode(), err.decode()
    finally:
        container.stop()


@pytest.mark.classic
def test_default_contract_passes_then_command_runs(cpu_image, no_leftovers):
    status, out, err = run_in(cpu_image, "python -c 'print(\"COMMAND RAN\")'")
    assert status == 0, out + err
    assert "[CHECK] pytorch: 2.13.0+cpu -> OK" in err  # the report goes to stderr: stdout is the command's
    assert out.strip() == "COMMAND RAN"


def test_sm80_contract_fails_before_the_command(cpu_image, tmp_path, no_leftovers):
    spec = tmp_path / "runtime-spec.yaml"
    spec.write_text('required_features:\n  - gpu_compute_capability: "sm_80"\n')
    status, out, err = run_in(cpu_image, "python -c 'print(\"COMMAND RAN\")'",
                              [(str(spec), "/workspace/runtime-spec.yaml")])
    out += err
    assert status == 3, out
    assert "COMMAND RAN" not in out
    assert "sm_80" in out and "FAIL" in out


def test_probe_describes_the_cpu(cpu_image, no_leftovers):
    status, out, err = run_in(cpu_image, "runtime-check probe --json")
    assert status == 0, out + err
    probe = json.loads(out[out.index("{"):out.rindex("}") + 1])
    assert probe["vendor"] == "none" and probe["backend"] == "cpu"
    assert probe["torch"]["version"] == "2.13.0+cpu"


def test_start_reads_the_build_time_torch_facts_with_the_same_verdicts(cpu_image, no_leftovers):
    # The entrypoint reads what torch said of its build when the image was built (recorded in the torch
    # stage) instead of importing it; RUNTIME_PROBE=torch imports it, and the report says so. Both must
    # give the same verdicts.
    command = "runtime-check check --json"
    status, recorded, err = run_in(cpu_image, command)
    assert status == 0, recorded + err
    status, imported, err = run_in(cpu_image, command, env={"RUNTIME_PROBE": "torch"})
    assert status == 0, imported + err
    from_record, from_torch = json.loads(recorded), json.loads(imported)
    assert from_record[-1].pop("torch_imported") is None
    assert from_torch[-1].pop("torch_imported").startswith("RUNTIME_PROBE=torch: torch imported")
    assert from_record == from_torch
    status, out, err = run_in(cpu_image, "test -s /opt/venv/share/ml-runtime/torch-facts.json")
    assert status == 0, out + err


@pytest.mark.classic
def test_builder_run_picks_cpu_and_returns_status(cpu_project, no_leftovers):
    proc = run_builder("run", "--", "python", "examples/train.py", cwd=cpu_project, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "FINAL first_loss=" in proc.stdout and "cpu" in proc.stderr
    failing = run_builder("run", "--", "python", "-c", "import sys; sys.exit(4)", cwd=cpu_project)
    assert failing.returncode == 4, failing.stderr[-1000:]
