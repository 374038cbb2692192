"""The current NVIDIA target (PyPI's CUDA 13 torch, ~2.9 GB of wheels, ~5.5 GB image): built and
smoke-tested for real by `make test` (so by CI). Skip it with `-m 'not heavy'` (make test-quick).

The wheels stay in the wheelhouse (~/.cache/ml-image-builder/wheels) for the next run; the
image and the layers only it uses are removed from the engine afterwards.
"""

from __future__ import annotations

import json

import docker
import pytest
import yaml
from helpers import run_builder

pytestmark = [pytest.mark.engine, pytest.mark.heavy]


def test_nvidia_cu130_builds_and_passes_smoke(cpu_project, engine):
    proc = run_builder("build", "-t", "nvidia-cu130", "--json", "-q", cwd=cpu_project, timeout=3600)
    out = json.loads(proc.stdout)[0] if proc.stdout.strip() else {}
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert out["smoke"] == "passed", out
        image = engine.api.inspect_image(out["image_id"])
        env = dict(e.split("=", 1) for e in image["Config"]["Env"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
        assert image["Config"]["Labels"]["io.ml-image-builder.torch"] == "2.14.1"
        # The shared layers are those of the cpu image: the same base and common stage.
        registry = yaml.safe_load((cpu_project / "matrix.yaml").read_text())["registry"]
        cpu = engine.api.inspect_image(f"{registry}:cpu")
        assert image["RootFS"]["Layers"][:4] == cpu["RootFS"]["Layers"][:4]
        assert image["RootFS"]["Layers"][4] != cpu["RootFS"]["Layers"][4]  # its own torch layer
    finally:
        if out.get("image_id"):  # keep the multi-GB image out of the engine (its layers too)
            try:
                engine.api.remove_image(out["image_id"], force=True)
            except docker.errors.APIError:
                pass
