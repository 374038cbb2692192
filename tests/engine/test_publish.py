"""Publishing to real registries: an htpasswd-protected one refuses without credentials and
accepts with them, the digests match, aliases move last, credentials never show."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import run_builder

from builder.oci.registry import manifest_digest
from devtools.support import copy_project, edit_matrix, retarget_base_lock

pytestmark = [pytest.mark.engine, pytest.mark.classic]


def _retarget(src_root, dest_root, registry: str) -> None:
    """A project copy publishing to *registry*, with the same base pin."""
    copy_project(dest_root)
    edit_matrix(dest_root, registry=registry)
    retarget_base_lock(src_root, dest_root, registry)


@pytest.fixture
def tagged_for(cpu_project, engine):
    """Tag the built cpu image for another registry; untag afterwards."""
    made = []

    def tag(registry: str) -> str:
        source = yaml.safe_load((cpu_project / "matrix.yaml").read_text())["registry"]
        image_id = engine.api.inspect_image(f"{source}:cpu")["Id"]
        for t in ("cpu", "cpu-torch2.13.0", "latest-cpu"):
            engine.api.tag(image_id, registry, t)
            made.append(f"{registry}:{t}")
        return image_id

    yield tag
    for ref in made:
        engine.api.remove_image(ref, noprune=True)


def test_push_needs_credentials_and_then_digests_match(cpu_project, auth_registry, tagged_for, engine, tmp_path):
    host, user, password = auth_registry
    registry = f"{host}/ml-runtime"
    root = tmp_path / "p"
    _retarget(cpu_project, root, registry)
    image_id = tagged_for(registry)
    no_config = {"DOCKER_CONFIG": str(tmp_path / "empty-docker-config"),
                 "BUILDER_REGISTRY_USER": "", "BUILDER_REGISTRY_PASSWORD": ""}
    (tmp_path / "empty-docker-config").mkdir()

    refused = run_builder("push", "-t", "cpu", cwd=root, env=no_config)
    assert refused.returncode == 1
    assert f"registry {host} refused the push" in refused.stderr and "docker login" in refused.stderr
    assert "Traceback" not in refused.stderr
    creds = {"username": user, "password": password}
    assert manifest_digest(f"{registry}:latest-cpu", creds) is None, "the alias moved before the versioned tags"

    env = {**no_config, "BUILDER_REGISTRY_USER": user, "BUILDER_REGISTRY_PASSWORD": password}
    pushed = run_builder("push", "-t", "cpu", cwd=root, env=env)
    assert pushed.returncode == 0, pushed.stderr
    assert password not in pushed.stdout + pushed.stderr
    record = json.loads((root / "dist/published.json").read_text())["cpu"]
    for tag in ("cpu", "cpu-torch2.13.0", "latest-cpu"):
        assert manifest_digest(f"{registry}:{tag}", creds) == record["digest"]
    assert f"{registry}@{record['digest']}" in engine.api.inspect_image(image_id)["RepoDigests"]
    assert record["image_id"] == image_id


def test_push_to_unreachable_registry_is_a_clear_error(cpu_project, tagged_for, tmp_path):
    registry = "127.0.0.1:9/ml-runtime"  # discard port: nothing listens
    root = tmp_path / "p"
    _retarget(cpu_project, root, registry)
    tagged_for(registry)
    proc = run_builder("push", "-t", "cpu", cwd=root)
    assert proc.returncode == 1
    assert "127.0.0.1:9" in proc.stderr and "Traceback" not in proc.stderr
    assert not (root / "dist/published.json").exists()


def test_push_publishes_what_build_push_does(cpu_project, registry, engine, tmp_path):
    """`builder push` of a smoke-tested image pushes its content tag too and records it, so the
    registry shows it tested: `builder matrix --changed` then lists it no more, as after build --push."""
    repo = f"{registry}/ml-runtime-push"
    root = tmp_path / "p"
    _retarget(cpu_project, root, repo)
    source = yaml.safe_load((cpu_project / "matrix.yaml").read_text())["registry"]
    image_id = engine.api.inspect_image(f"{source}:cpu")["Id"]
    printed = json.loads(run_builder("print", "-t", "cpu", cwd=root).stdout)
    content_tag = printed["targets"][0]["content_tags"][printed["targets"][0]["platform"]]
    made = [content_tag, *(f"{repo}:{t}" for t in ("cpu", "cpu-torch2.13.0", "latest-cpu"))]
    for ref in made:
        engine.api.tag(image_id, *ref.rsplit(":", 1))
    try:
        before = run_builder("matrix", "--changed", "--format", "json", cwd=root)
        assert "cpu" in {row["target"] for row in json.loads(before.stdout)}, before.stdout + before.stderr
        pushed = run_builder("push", "-t", "cpu", cwd=root)
        assert pushed.returncode == 0, pushed.stderr
        record = json.loads((root / "dist/published.json").read_text())["cpu"]
        assert record["content_tag"] == content_tag and content_tag in record["tags"]
        assert manifest_digest(content_tag) == record["digest"] == manifest_digest(f"{repo}:cpu")
        after = run_builder("matrix", "--changed", "--format", "json", cwd=root)
        assert after.returncode == 0, after.stderr
        assert "cpu" not in {row["target"] for row in json.loads(after.stdout)}, after.stdout
    finally:
        for ref in made:
            engine.api.remove_image(ref, noprune=True)
