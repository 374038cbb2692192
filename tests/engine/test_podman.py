"""podman, the second engine: the cpu target built (buildah), smoke-tested, pushed in the matrix's
compression, signed, verified and run with podman alone. Every builder command here runs with
DOCKER_HOST pointing nowhere, so none of it reaches Docker; the Docker engine of the session only
made the base these builds start from (copied into this test's repository byte for byte).

Rootful: the podman of the user the tests run as (root on CI). Rootless is not tested here
(docs/building.md says why and what a rootless user needs)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import (
    cosign_passes,
    index_platforms,
    multiarch_project,
    publish_base_to,
    require_peers,
    run_builder,
)

from builder.oci import artifacts
from builder.oci.registry import credentials
from devtools.support import base_pin, copy_project, fail_or_skip

pytestmark = [pytest.mark.engine, pytest.mark.podman, pytest.mark.slow]

NO_DOCKER = {"BUILDER_ENGINE": "podman", "DOCKER_HOST": "unix:///nonexistent"}


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def podman_project(based_project, engine, tmp_path_factory) -> Iterator[tuple[Path, str]]:
    """A copy of the project whose registry is the session's under a repository of its own (no tag of the
    Docker tests' is touched), its base copied there; yields (root, registry). Removes its podman images."""
    if shutil.which("podman") is None:
        fail_or_skip("podman is not installed (make host ENGINE=podman)")
    root = copy_project(tmp_path_factory.mktemp("podman") / "project")
    doc = yaml.safe_load((based_project / "matrix.yaml").read_text())
    doc["registry"] = doc["registry"] + "-podman"
    (root / "matrix.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    publish_base_to(engine, based_project, root, doc["registry"])
    containers = set(podman("ps", "-aq").split())
    yield root, doc["registry"]
    left = set(podman("ps", "-aq").split()) - containers
    ours = [name for name in podman("images", "--format", "{{.Repository}}:{{.Tag}}").split()
            if name.startswith(doc["registry"])]
    if ours:  # our tags only; the layers stay as podman's build cache, as BuildKit's do
        subprocess.run(["podman", "rmi", "--force", *ours], capture_output=True, check=False)
    assert not left, f"podman containers left behind: {left}"


@pytest.mark.timeout(1500)
def test_podman_builds_pushes_signs_and_runs_cpu_without_docker(podman_project, signing_key):
    root, repo = podman_project
    build = run_builder("build", "-t", "cpu", "--push", "--json", "-q", "--sign-key", str(signing_key["private"]),
                        cwd=root, env=NO_DOCKER)
    assert build.returncode == 0, build.stderr[-3000:] + build.stdout
    (out,) = json.loads(build.stdout)
    assert (out["result"], out["smoke"]) == ("built", "passed"), out
    digest = out["digest"]
    # The matrix's compression (zstd) on every layer, the base's too: podman < 4.7 reuses the base's gzip blob
    # the registry holds, and a mixed image breaks enroot 4.0-4.1.2; builder recompresses it after the push
    found = artifacts.get_manifest(f"{repo}@{digest}", credentials(repo.split("/", 1)[0]))
    assert found is not None
    layers = json.loads(found[1])["layers"]
    assert all(layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+zstd" for layer in layers), layers

    verify = run_builder("verify", f"{repo}:cpu", "--key", str(signing_key["public"]), cwd=root, env=NO_DOCKER)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert all(line.endswith(f"names {repo}@{digest}") for line in verify.stdout.splitlines())
    require_peers()
    assert cosign_passes(f"{repo}:cpu", signing_key["public"]) == [True, True, True]

    again = run_builder("build", "-t", "cpu", "--json", "-q", cwd=root, env=NO_DOCKER)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)[0]["result"] == "reused-local", "the content tag names the image: no rebuild"

    run = run_builder("run", "--engine", "podman", "--", "python", "-c", "import torch; print(torch.__version__)",
                      cwd=root, env={"DOCKER_HOST": "unix:///nonexistent"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1].startswith("2.13.0"), run.stdout


def test_a_smoke_container_on_podman_is_as_on_docker_empty_tmpfs_and_variables_unset(podman_project):
    """What the smoke test under qemu asks of its container, asked of podman (run natively here: the mount
    and the environment are the same): an empty read-only tmpfs over /sys/devices/system/cpu (podman copies
    what is at a tmpfs's path onto it by default, which fails on sysfs), and a bare name in the environment
    unsetting the image's variable, as Docker's API does (TINI_SUBREAPER, fatal under qemu; the compatible
    API kept it). Both failed every emulated smoke test on podman. Here the base's LANG is unset."""
    from builder.oci.podman import connect_podman

    root, _ = podman_project
    base = base_pin(root)["reference"]
    engine = connect_podman()
    try:
        engine.pull(base, credentials(base.split("/", 1)[0]))  # the session's registry takes its login only
        script = ("ls -A /sys/devices/system/cpu | wc -l; touch /sys/devices/system/cpu/x 2>/dev/null || echo read-only;"
                  " echo ${LANG-unset} $A")
        status, out, _ = engine.run(base, ["sh", "-c", script], labels={}, timeout=120, network_mode="none",
                                    tmpfs={"/sys/devices/system/cpu": "ro"}, environment=["LANG", "A=1"])
    finally:
        engine.close()
    assert (status, out.split()) == (0, ["0", "read-only", "unset", "1"]), out


def test_doctor_names_podman_its_version_mode_and_what_it_lacks(podman_project):
    root, _ = podman_project
    proc = run_builder("doctor", "--json", "--engine", "podman", cwd=root, env={"DOCKER_HOST": "unix:///nonexistent"})
    checks = {c["item"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["podman"]["status"] == "ok", checks["podman"]
    version = podman("version", "--format", "{{.Client.Version}}").strip()
    assert f"podman {version} " in checks["podman"]["found"] and "rootful" in checks["podman"]["found"]
    assert "registry cache" in checks["podman lacks"]["found"]


@pytest.mark.emulated
@pytest.mark.timeout(3 * 5400)
def test_podman_builds_nvidia_cu130_arm64_under_emulation_into_one_index_with_amd64(registry, tmp_path):
    """The multi-platform path on podman alone: the foreign platform (arm64 on x86_64) built by buildah and
    smoke-tested under qemu, then the native one; the same tags end as one OCI index (written through the
    registry API, as on Docker) listing both, every layer of both in the matrix's compression. The bases
    are bootstrapped with podman too (``--update-base``): nothing here reaches Docker."""
    if shutil.which("podman") is None:
        fail_or_skip("podman is not installed (make host ENGINE=podman)")
    root, repo, host, foreign = multiarch_project(tmp_path, registry, "multiarch-podman")
    outs: dict[str, dict] = {}
    try:
        for platform in (foreign, host):
            proc = run_builder("build", "-t", "nvidia-cu130", "--platform", platform, "--push", "--update-base",
                               "--json", "-q", cwd=root, env=NO_DOCKER, timeout=5400)
            (out,) = json.loads(proc.stdout) if proc.stdout.strip() else [{}]
            outs[platform] = out
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert (out["result"], out["smoke"], out["platform"]) == ("built", "passed", platform), out
        notes = " ".join(outs[foreign]["notes"])
        assert "training skipped" in notes and "emulation" in notes, outs[foreign]
        arch = podman("image", "inspect", "--format", "{{.Architecture}}", outs[foreign]["image_id"]).strip()
        assert arch == foreign.split("/")[1]
        listed = index_platforms(f"{repo}:nvidia-cu130")
        assert listed == {p: outs[p]["digest"] for p in (host, foreign)}
        for platform, digest in listed.items():
            found = artifacts.get_manifest(f"{repo}@{digest}", credentials(repo.split("/", 1)[0]))
            assert found is not None
            types = {layer["mediaType"] for layer in json.loads(found[1])["layers"]}
            assert types == {"application/vnd.oci.image.layer.v1.tar+zstd"}, (platform, types)
    finally:
        made = [ref for out in outs.values() for ref in (out.get("image_id"), out.get("content_tag")) if ref]
        if made:
            subprocess.run(["podman", "rmi", "--force", *made], capture_output=True, check=False)


def test_every_builder_process_files_its_records_of_podman_under_one_key():
    """Where no podman API socket listens, each builder process starts a podman service of its own on a
    private socket; its records of podman's images and cache (the ledgers ``builder gc`` reads) are
    filed under podman's storage, not that socket, so a later run's gc finds them."""
    if shutil.which("podman") is None:
        fail_or_skip("podman is not installed (make host ENGINE=podman)")
    from builder.gc import owned
    from builder.oci.podman import PodmanEngine

    one, two = PodmanEngine.from_env(), PodmanEngine.from_env()
    try:
        graph_root = subprocess.run(["podman", "info", "--format", "{{.Store.GraphRoot}}"], capture_output=True,
                                    text=True, check=True).stdout.strip()
        assert one.store_key() == two.store_key() == f"storage {graph_root}"
        assert owned.images_ledger(one).path == owned.images_ledger(two).path
    finally:
        one.close()
        two.close()
