"""Shared fixtures for the in-image runtime tests.

The runtime is a standalone distribution under runtime/, imported here from
source (it is not installed into the development venv). The tests need the CPU
build of torch and accelerate in the venv (as in the images); they fail, not
skip, without them so that a missing install step cannot pass unnoticed. Files under
fixtures/ are recordings of torch facts and vendor tool output from machines
we do not have (NVIDIA, AMD, Intel); see fixtures/README.md.

The tests hold on any host, a GPU host too: a test that means "no accelerator" makes it so
(:data:`NO_ACCELERATOR`: torch is shown no device, and the runtime reads the host's /dev and /sys
from an empty tree); a test that probes the host asserts what the host has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNTIME_SRC = REPO / "runtime"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

if str(RUNTIME_SRC) not in sys.path:
    sys.path.insert(0, str(RUNTIME_SRC))

# Variables the runtime reads; tests must not inherit them from the caller.
RUNTIME_VARIABLES = (
    "RUNTIME_SPEC",
    "RUNTIME_CHECK_MODE",
    "RUNTIME_PROBE_TIMEOUT",
    "ACCELERATOR_CONFIG",
    "RUNTIME_WORKSPACE",
    "RUNTIME_CHECK_DEBUG",
    "RUNTIME_PROBE",
    "RUNTIME_RECORD_DIR",
    "RUNTIME_HOST_ROOT",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
)

#: A host without an accelerator, on any host: torch is shown no NVIDIA or AMD device (CUDA and HIP
#: read these before they count devices), and the runtime's own readers (device nodes, KFD) see an
#: empty tree. Intel's devices cannot be hidden this way (unverified: no Intel host here).
NO_ACCELERATOR = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}


@pytest.fixture
def no_accelerator(tmp_path: Path) -> dict[str, str]:
    """Environment for a child process that must see no accelerator (:data:`NO_ACCELERATOR`)."""
    empty = tmp_path / "empty-host"
    empty.mkdir(exist_ok=True)
    return {**NO_ACCELERATOR, "RUNTIME_HOST_ROOT": str(empty)}


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty stand-in for /workspace, with the runtime's variables cleared."""
    for name in RUNTIME_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    ws = tmp_path / "workspace"
    ws.mkdir()
    monkeypatch.setenv("RUNTIME_WORKSPACE", str(ws))
    return ws


@pytest.fixture
def fixture_text():
    """Read a recorded tool output from fixtures/."""

    def read(name: str) -> str:
        return (FIXTURES / name).read_text(encoding="utf-8")

    return read


@pytest.fixture
def recorded_facts():
    """Load recorded TorchFacts (NVIDIA, AMD, Intel machines) by vendor name."""
    from ml_runtime.devices.facts import TorchFacts

    def load(vendor: str, **overrides):
        data = json.loads((FIXTURES / f"torch_facts_{vendor}.json").read_text(encoding="utf-8"))
        data.update(overrides)
        return TorchFacts.from_dict(data)

    return load


@pytest.fixture
def cli_env(workspace: Path) -> dict[str, str]:
    """Environment for running the runtime from source in a subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in RUNTIME_VARIABLES}
    env["PYTHONPATH"] = str(RUNTIME_SRC)
    # Importing torch in the probe's child takes seconds, and minutes on a loaded shared host: the
    # default 10 s would fail the checks; the tests of the timeout set their own.
    env["RUNTIME_PROBE_TIMEOUT"] = "300"
    env["RUNTIME_WORKSPACE"] = str(workspace)
    return env


@pytest.fixture
def run_cli(workspace: Path, cli_env: dict[str, str]):
    """Run ``python -m ml_runtime ARGS`` in a subprocess with a clean environment."""

    def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
        return subprocess.run(
            [sys.executable, "-m", "ml_runtime", *args],
            env={**cli_env, **(env or {})},
            cwd=str(cwd or workspace),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    return run
