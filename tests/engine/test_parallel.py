"""--jobs: targets build side by side; the shared stage is built once and its layers are the
same in every image."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import publish_base_to, remove_clone_images, run_builder

from devtools.support import copy_project, host_platform

pytestmark = pytest.mark.engine


def test_two_targets_in_parallel_share_the_common_layers(based_project, engine, tmp_path):
    root = copy_project(tmp_path / "p")
    doc = yaml.safe_load((based_project / "matrix.yaml").read_text())
    doc["registry"] = doc["registry"] + "-parallel"
    doc["targets"].append({"name": "cpu-extra", "backend": "cpu", "torch": "2.13.0", "packages": ["six>=1.16"]})
    (root / "matrix.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    lock = publish_base_to(engine, based_project, root, doc["registry"])
    try:
        proc = run_builder("build", "-t", "cpu", "-t", "cpu-extra", "--jobs", "2", "--no-smoke", "--json", "-q",
                           cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = {o["target"]: o for o in json.loads(proc.stdout)}
        assert out["cpu"]["image_id"] != out["cpu-extra"]["image_id"]
        cpu, extra = (engine.client.api.inspect_image(out[t]["image_id"])["RootFS"]["Layers"]
                      for t in ("cpu", "cpu-extra"))
        base = engine.client.api.inspect_image(lock["reference"])["RootFS"]["Layers"]
        # The base, the common stage (users/venv, common packages), then the wheel layers of the
        # plan (torch, accelerate) and the start-up bytecode: reproducible, so built side by side
        # they are still the same objects; the last layer (cpu-extra's packages) differs.
        shared = len(base) + 5
        assert cpu[:len(base)] == base
        assert cpu[:shared] == extra[:shared], "the common stage's or the wheel layers differ between the targets"
        assert cpu[-1] != extra[-1], "different packages, different last layers"
        arch = host_platform().split("/")[1]
        assert "six" in (root / f"images/cpu-extra/requirements.{arch}.lock").read_text()
    finally:
        for image in engine.client.images.list(name=doc["registry"]):
            for tag in image.tags:  # the same image may carry other tests' tags: only ours go
                if tag.startswith(doc["registry"] + ":"):
                    engine.client.api.remove_image(tag, noprune=True)
        remove_clone_images(engine, root)  # the shared stage's untagged image, and the targets' now
