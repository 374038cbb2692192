"""The current NVIDIA target (PyPI's CUDA 13 torch, ~2.9 GB of wheels, ~5.4 GB image): built and
smoke-tested for real. Opt in with `pytest -m heavy` (make test-heavy); CI need not run it."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import run_builder

pytestmark = [pytest.mark.engine, pytest.mark.heavy]


def test_nvidia_cu130_builds_and_passes_smoke(cpu_project, engine):
    proc = run_builder("build", "-t", "nvidia-cu130", "--json", "-q", cwd=cpu_project, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)[0]
    assert out["smoke"] == "passed", out
    config = engine.api.inspect_image(out["image_id"])["Config"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    # The shared layers are those of the cpu image: the same base and common stage.
    registry = yaml.safe_load((cpu_project / "matrix.yaml").read_text())["registry"]
    cpu = engine.api.inspect_image(f"{registry}:cpu")
    assert engine.api.inspect_image(out["image_id"])["RootFS"]["Layers"][:4] == cpu["RootFS"]["Layers"][:4]
