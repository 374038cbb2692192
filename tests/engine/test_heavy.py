"""The current NVIDIA target (PyPI's CUDA 13 torch, ~2.9 GB of wheels, ~5.5 GB image): built and
smoke-tested for real by `make test-heavy` (marker ``heavy``: outside `make test`, which keeps to CI's 45 minutes).

Its other platform (arm64 on an x86_64 host), built and smoke-tested under qemu emulation, is
marked ``emulated`` as well: `make test-emulated` runs it (see docs/testing.md for why it is apart).

The wheels stay in the wheelhouse (~/.cache/ml-image-builder/wheels) for the next run; the
image and the layers only it uses are removed from the engine afterwards.
"""

from __future__ import annotations

import json

import docker
import pytest
import yaml
from helpers import index_platforms, multiarch_project, run_builder

pytestmark = [pytest.mark.engine, pytest.mark.heavy]


@pytest.mark.timeout(2400)  # a cold build with ~2.9 GB of wheels to download: 471 s on this 2-core kind
def test_nvidia_cu130_builds_and_passes_smoke(cpu_project, engine):
    proc = run_builder("build", "-t", "nvidia-cu130", "--json", "-q", cwd=cpu_project, timeout=2300)
    out = json.loads(proc.stdout)[0] if proc.stdout.strip() else {}
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert out["smoke"] == "passed", out
        image = engine.client.api.inspect_image(out["image_id"])
        env = dict(e.split("=", 1) for e in image["Config"]["Env"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
        assert image["Config"]["Labels"]["io.ml-image-builder.torch"] == "2.14.1"
        # The shared layers are those of the cpu image: the same base and common stage (users, the
        # WORKDIR's empty layer, the common wheels); then its first layer of the plan, cuda-dnn.
        registry = yaml.safe_load((cpu_project / "matrix.yaml").read_text())["registry"]
        cpu = engine.client.api.inspect_image(f"{registry}:cpu")
        assert image["RootFS"]["Layers"][:4] == cpu["RootFS"]["Layers"][:4]
        assert image["RootFS"]["Layers"][4] != cpu["RootFS"]["Layers"][4]
    finally:
        if out.get("image_id"):  # keep the multi-GB image out of the engine (its layers too)
            try:
                engine.client.api.remove_image(out["image_id"], force=True)
            except docker.errors.APIError:
                pass


@pytest.mark.emulated
@pytest.mark.timeout(3 * 5400)
def test_nvidia_cu130_arm64_under_emulation_joins_amd64_in_one_index(tmp_path, engine, registry):
    """The foreign platform, for real: the arm64 image is built and smoke-tested under qemu, then the
    amd64 build publishes the same tags as one index listing both (read back with skopeo)."""
    root, repo, host, foreign = multiarch_project(tmp_path, registry, "multiarch-gpu")
    pins = json.loads((root / "base.lock.json").read_text())["platforms"]
    made: list[str] = []
    try:
        for platform, pinned in pins.items():  # the committed bases, pushed to this registry (same digests)
            try:
                engine.client.api.tag(pinned["reference"], f"{repo}/base", platform.split("/")[1])
            except docker.errors.ImageNotFound:
                continue  # not local: the build bootstraps it (reproducible: the same pin)
            made.append(f"{repo}/base:{platform.split('/')[1]}")
            engine.push(made[-1])
        outs = {}
        for platform in (foreign, host):
            proc = run_builder("build", "-t", "nvidia-cu130", "--platform", platform, "--push", "--update-base",
                               "--json", "-q", cwd=root, timeout=5400)
            (out,) = json.loads(proc.stdout) if proc.stdout.strip() else [{}]
            outs[platform] = out
            made += [out.get("image_id") or "", out.get("content_tag") or ""]
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert out["smoke"] == "passed" and out["platform"] == platform, out
        notes = " ".join(outs[foreign]["notes"])
        assert "training skipped" in notes and "emulation" in notes, outs[foreign]
        arch = engine.client.api.inspect_image(outs[foreign]["image_id"])["Architecture"]
        assert arch == foreign.split("/")[1]
        listed = index_platforms(f"{repo}:nvidia-cu130")
        assert listed == {p: outs[p]["digest"] for p in (host, foreign)}
        published = json.loads((root / "dist" / "published.json").read_text())["nvidia-cu130"]
        assert published["platforms"] == listed
    finally:
        for ref in filter(None, made):
            try:
                engine.client.api.remove_image(ref, force=True)
            except docker.errors.APIError:
                pass
