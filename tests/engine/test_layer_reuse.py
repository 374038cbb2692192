"""The layer plan on the real engine and a real registry: wheel layers are reproducible, and two
targets that differ only in ``packages:`` share every layer but the last, so a change to those
packages pushes that one layer."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request

import pytest
import yaml
from helpers import run_builder

from builder.config.project import load_project
from devtools.dockerd import extra_dockerd
from devtools.support import (
    auth_header,
    edit_matrix,
    host_platform,
    registry_layers,
    registry_manifest,
    registry_of,
)

pytestmark = pytest.mark.engine

#: The diff ID of an empty layer (an empty tar): what a step that changes nothing makes in BuildKit.
EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"


def _get(url: str) -> dict:
    host = url.split("/")[2]
    with urllib.request.urlopen(urllib.request.Request(url, headers=auth_header(host)), timeout=30) as response:
        return json.loads(response.read())


def repo_layer_blobs(repository: str) -> set[str]:
    """Every layer blob that some tag of the repository references, read from the registry itself:
    the images' layers, and those of the BuildKit cache ``--push`` exports (an index of blobs)."""
    host, name = repository.split("/", 1)
    tags = _get(f"http://{host}/v2/{name}/tags/list").get("tags") or []
    blobs = {digest for tag in tags if not tag.startswith("buildcache-")
             for digest in manifest_layers(f"{repository}:{tag}")}
    for tag in (t for t in tags if t.startswith("buildcache-")):
        request = urllib.request.Request(f"http://{host}/v2/{name}/manifests/{tag}",
                                         headers={"Accept": "application/vnd.oci.image.index.v1+json",
                                                  **auth_header(host)})
        with urllib.request.urlopen(request, timeout=30) as response:
            blobs |= {m["digest"] for m in json.loads(response.read())["manifests"]
                      if "layer" in m["mediaType"]}
    return blobs


def manifest_layers(ref: str) -> list[str]:
    return [digest for digest, _ in registry_layers(ref)]


def with_packages(root, packages: list[str]) -> None:
    """Give root's matrix a target cpu-hf: cpu plus *packages*, nothing else different."""
    doc = yaml.safe_load((root / "matrix.yaml").read_text())
    cpu = next(t for t in doc["targets"] if t["name"] == "cpu")
    others = [t for t in doc["targets"] if t["name"] != "cpu-hf"]
    edit_matrix(root, targets=[*others, {**cpu, "name": "cpu-hf", "packages": packages}])


def build(root, *args: str) -> dict:
    proc = run_builder("build", "--json", "-q", "--push", *args, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    return {o["target"]: o for o in json.loads(proc.stdout)}


def test_targets_differing_only_in_packages_share_all_but_the_last_layer(cpu_project, engine, tmp_path,
                                                                         no_leftovers):
    root = tmp_path / "project"
    shutil.copytree(cpu_project, root, ignore=shutil.ignore_patterns("dist"))
    with_packages(root, ["einops==0.8.0"])
    out = build(root, "-t", "cpu", "-t", "cpu-hf")
    cpu, hf = (engine.client.api.inspect_image(out[t]["image_id"])["RootFS"]["Layers"] for t in ("cpu", "cpu-hf"))
    # cpu has no packages of its own: its packages step installs nothing, so BuildKit gives it the
    # empty layer. cpu-hf is every other layer of cpu, plus its own packages layer.
    assert cpu[-1] == EMPTY_LAYER
    assert hf[:-1] == cpu[:-1] and hf[-1] not in cpu
    assert "einops==0.8.0" in (root / "images" / "cpu-hf" / f"requirements.{host_platform().split('/')[1]}.lock").read_text()

    # A change to cpu-hf's packages: the push uploads its last layer and nothing else.
    repository = registry_of(root)
    before = repo_layer_blobs(repository)
    with_packages(root, ["einops==0.8.1"])
    out = build(root, "-t", "cpu-hf")
    assert out["cpu-hf"]["result"] == "built"
    pushed = manifest_layers(f"{repository}:cpu-hf")
    new = [d for d in pushed if d not in before]
    assert new == [pushed[-1]], f"{len(new)} new layer blobs in the registry, expected only the packages layer"
    rebuilt = engine.client.api.inspect_image(out["cpu-hf"]["image_id"])["RootFS"]["Layers"]
    assert rebuilt[:-1] == cpu[:-1] and rebuilt[-1] != hf[-1]


@pytest.mark.classic
def test_every_layer_is_reproducible_without_cache(cpu_project, engine, no_leftovers):
    """A build from scratch (no cache) gives the same digest for every layer, on either store: the
    base, the common packages, torch, accelerate, the start-up bytecode, and the runtime and
    examples too (they come as bind mounts with fixed times, not COPY with the checkout's); cpu's
    packages step, which installs nothing, gives the empty layer (on the classic store it held /etc
    when the base had no /etc/hosts: see builder/base/bootstrap.py)."""
    project = load_project(cpu_project / "matrix.yaml")
    cpu = project.target("cpu").on(host_platform())
    cached = engine.client.api.inspect_image(cpu.primary_ref)["RootFS"]["Layers"]
    # As a user rebuilds: `--rebuild` builds without the layer cache (the image replaces the tags it had).
    proc = run_builder("build", "-t", "cpu", "--platform", cpu.platform, "--rebuild", "--no-smoke", "-q", "--json",
                       cwd=cpu_project)
    assert proc.returncode == 0, proc.stderr
    (out,) = json.loads(proc.stdout)
    fresh = engine.client.api.inspect_image(out["image_id"])["RootFS"]["Layers"]
    assert out["cached_steps"] == 0 and out["steps"] > 0
    assert fresh == cached
    assert fresh[-1] == EMPTY_LAYER


@pytest.mark.heavy  # two more engines pull and run the image: make test-heavy
def test_every_layer_of_a_pushed_image_has_the_targets_compression(cpu_project, tmp_path, no_leftovers):
    """Every layer of a pushed image, read from the registry, has its target's compression, the
    base's layer included (the registry holds the base as gzip): enroot 4.0-4.1.2 apply the first
    layer's media type to every layer, so a mixed image breaks there. zstd is the default; a gzip
    target built after it gets gzip layers where the engine holds them as zstd (here the packages
    layer, which no other test builds), not the zstd blobs BuildKit already has.

    The zstd image is published with OCI media types and pulls and runs on empty engines of both
    stores: with Docker's media types (the docker exporter's default) the push succeeded and every
    pull failed ("mismatched image rootfs and manifest layers")."""
    root = tmp_path / "project"
    shutil.copytree(cpu_project, root, ignore=shutil.ignore_patterns("dist"))
    with_packages(root, ["einops==0.7.0"])
    doc = yaml.safe_load((root / "matrix.yaml").read_text())

    def build_as(compression: str) -> tuple[list[str], str]:
        for t in doc["targets"]:
            if t["name"] == "cpu-hf":
                t["compression"] = compression
        edit_matrix(root, targets=doc["targets"])
        out = build(root, "-t", "cpu-hf")["cpu-hf"]
        assert out["result"] == "built", out
        return [layer["mediaType"] for layer in registry_manifest(out["content_tag"])["layers"]], out["content_tag"]

    zstd, ref = build_as("zstd")
    assert len(zstd) > 3 and set(zstd) == {"application/vnd.oci.image.layer.v1.tar+zstd"}, zstd
    base = registry_manifest(load_project(root / "matrix.yaml").base_for(host_platform()))["layers"]
    assert not any(layer["mediaType"].endswith("zstd") for layer in base), \
        "the registry holds the base's layer as pushed (a tar): the zstd image's first layer was compressed again"
    for store in ("containerd", "classic"):
        with extra_dockerd(tmp_path / f"node-{store}", "zs", store=store) as node:
            for argv in (["pull", "-q", ref], ["run", "--rm", ref, "python", "-c", "import torch"]):
                proc = subprocess.run(["docker", "-H", node, *argv], capture_output=True, text=True, check=False)
                assert proc.returncode == 0, f"{store} store: docker {argv[0]}: {proc.stderr[-1500:]}"
    gzip_, _ = build_as("gzip")
    assert len(gzip_) == len(zstd) and set(gzip_) == {"application/vnd.docker.image.rootfs.diff.tar.gzip"}, gzip_
