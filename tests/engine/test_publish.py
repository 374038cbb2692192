"""Publishing to real registries: an htpasswd-protected one refuses without credentials and
accepts with them, the digests match, aliases move last, credentials never show."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import cosign_passes, discover, load_one_file_image, require_peers, run_builder

from builder.oci import registry as oci
from builder.oci.registry import manifest_digest
from builder.supply.attach import ARTIFACT_TYPES, COSIGN_SIG_ARTIFACT
from devtools.support import copy_project, edit_matrix, host_platform, retarget_base_lock

pytestmark = [pytest.mark.engine, pytest.mark.classic]


def changed_rows(root) -> dict[str, list[str]]:
    """{target: its platforms} that `builder matrix --changed` lists (the registry lacks their content tag)."""
    run = run_builder("matrix", "--changed", "--format", "json", cwd=root)
    assert run.returncode == 0, run.stderr
    rows: dict[str, list[str]] = {}
    for row in json.loads(run.stdout):
        rows.setdefault(row["target"], []).append(row["platform"])
    return rows


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
        image_id = engine.client.api.inspect_image(f"{source}:cpu")["Id"]
        for t in ("cpu", "cpu-torch2.13.0", "latest-cpu"):
            engine.client.api.tag(image_id, registry, t)
            made.append(f"{registry}:{t}")
        return image_id

    yield tag
    for ref in made:
        engine.client.api.remove_image(ref, noprune=True)


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
    assert f"registry {host} takes no request without a login, and the builder holds none for it: if it is " \
           f"yours, docker login {host}" in refused.stderr, refused.stderr
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
    assert f"{registry}@{record['digest']}" in engine.client.api.inspect_image(image_id)["RepoDigests"]
    assert record["image_id"] == image_id


def test_push_to_unreachable_registry_is_a_clear_error(cpu_project, tagged_for, tmp_path):
    registry = "127.0.0.1:9/ml-runtime"  # discard port: nothing listens
    root = tmp_path / "p"
    _retarget(cpu_project, root, registry)
    tagged_for(registry)
    proc = run_builder("push", "-t", "cpu", cwd=root)
    assert proc.returncode == 1
    assert "registry 127.0.0.1:9 is unreachable" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "not in registry" not in proc.stderr and "no local image" not in proc.stderr
    assert not (root / "dist/published.json").exists()


def test_build_with_its_registry_unreachable_says_so_not_that_the_base_is_missing(cpu_project, tmp_path):
    """A fresh machine: the base pin (a digest this engine lacks) names the registry, which is down.
    The one line says unreachable (never "is not in registry" or "bootstrapping it"), with the exit
    code of a user error, and nothing is built. (A registry on loopback would be started on demand:
    this one is TEST-NET-1, RFC 5737, which no host answers.)"""
    root = tmp_path / "p"
    registry = "192.0.2.1:5000/ml-runtime"
    copy_project(root)
    edit_matrix(root, registry=registry)
    retarget_base_lock(cpu_project, root, registry, digest="sha256:" + "0" * 64)
    proc = run_builder("build", "-t", "cpu", "--json", cwd=root)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "unreachable" in line]
    assert lines and lines[0].startswith("error: registry 192.0.2.1:5000 is unreachable"), proc.stderr
    assert "not in registry" not in proc.stderr and "bootstrapping" not in proc.stderr
    assert "Traceback" not in proc.stderr


def test_push_publishes_what_build_push_does(cpu_project, registry, engine, tmp_path):
    """`builder push` of a smoke-tested image pushes its content tag too and records it, so the
    registry shows it tested: `builder matrix --changed` then lists it no more, as after build --push."""
    repo = f"{registry}/ml-runtime-push"
    root = tmp_path / "p"
    _retarget(cpu_project, root, repo)
    source = yaml.safe_load((cpu_project / "matrix.yaml").read_text())["registry"]
    image_id = engine.client.api.inspect_image(f"{source}:cpu")["Id"]
    printed = json.loads(run_builder("print", "-t", "cpu", cwd=root).stdout)
    content_tag = printed["targets"][0]["content_tags"][printed["targets"][0]["platform"]]
    made = [content_tag, *(f"{repo}:{t}" for t in ("cpu", "cpu-torch2.13.0", "latest-cpu"))]
    for ref in made:
        engine.client.api.tag(image_id, *ref.rsplit(":", 1))
    try:
        assert "cpu" in changed_rows(root)
        pushed = run_builder("push", "-t", "cpu", cwd=root)
        assert pushed.returncode == 0, pushed.stderr
        record = json.loads((root / "dist/published.json").read_text())["cpu"]
        assert record["content_tag"] == content_tag and content_tag in record["tags"]
        creds = oci.credentials(repo.split("/", 1)[0])  # the session's docker login
        assert manifest_digest(content_tag, creds) == record["digest"] == manifest_digest(f"{repo}:cpu", creds)
        assert "cpu" not in changed_rows(root)
    finally:
        for ref in made:
            engine.client.api.remove_image(ref, noprune=True)


def test_push_of_a_multi_platform_target_publishes_each_platform_and_the_index(
        cpu_project, registry, engine, tmp_path):
    """`builder push` of nvidia-cu130 (amd64 and arm64), each platform's image built and tested earlier:
    both content tags go to the registry, one index under each of its tags lists both, each image
    and the index are signed (cosign and oras accept them as peers), and `builder matrix --changed`
    lists the target no more: what `build --push` publishes (test_heavy.py builds it under qemu).

    The two images are one-file stand-ins (this host builds no foreign platform within the suite's
    time) tagged as `builder build` tags what passed its smoke test; the engine, the registry, the
    push, the index and the signatures are real.
    """
    require_peers()
    repo = f"{registry}/ml-runtime-push-mp"
    root = tmp_path / "p"
    _retarget(cpu_project, root, repo)
    printed = json.loads(run_builder("print", "-t", "nvidia-cu130", cwd=root).stdout)["targets"][0]
    content = printed["content_tags"]
    assert sorted(content) == ["linux/amd64", "linux/arm64"]
    key, pub = tmp_path / "cosign.key", tmp_path / "cosign.pub"
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = ec.generate_private_key(ec.SECP256R1())
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    pub.write_bytes(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
    tags = printed["refs"]
    assert tags[0] == f"{repo}:nvidia-cu130"
    made: list[str] = []
    try:
        for platform in content:
            arch = platform.split("/")[1]
            own = [f"{t}-{arch}" for t in tags] + (tags if platform == host_platform() else [])
            load_one_file_image(engine, tmp_path / arch, arch, content[platform],
                                {"org.opencontainers.image.revision": "test"})
            made.append(content[platform])
            for ref in own:  # what `builder build` tags after a passed smoke test (by name: IDs differ by store)
                engine.client.api.tag(content[platform], *ref.rsplit(":", 1))
                made.append(ref)
        assert changed_rows(root).get("nvidia-cu130") == list(content)

        pushed = run_builder("push", "-t", "nvidia-cu130", "--sign-key", str(key), cwd=root, timeout=600)
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        assert "the content tag is not pushed" not in pushed.stdout + pushed.stderr

        creds = oci.credentials(registry)  # the session's docker login
        digests = {p: oci.manifest_digest(content[p], creds) for p in content}
        assert all(digests.values()), digests
        records = json.loads((root / "dist/published.json").read_text())
        index = records["nvidia-cu130"]
        assert index["platforms"] == digests
        for ref in tags:
            assert oci.manifest_digest(ref, creds) == index["digest"], ref
        for platform, digest in digests.items():
            view = records[f"nvidia-cu130 ({platform})"]
            assert view["digest"] == digest and content[platform] in view["tags"]
            assert set(view["attachments"]) == {"sig", "sbom", "att"}
            assert cosign_passes(f"{repo}@{digest}", pub) == [True, True, True], platform
            assert sorted(d["artifactType"] for d in discover(f"{repo}@{digest}")) == sorted(ARTIFACT_TYPES.values())
        assert cosign_passes(f"{repo}:nvidia-cu130", pub)[0]  # the index by its tag: its signature
        assert [d["artifactType"] for d in discover(f"{repo}:nvidia-cu130")] == [COSIGN_SIG_ARTIFACT]
        verify = run_builder("verify", f"{repo}:nvidia-cu130", "--key", str(pub), cwd=root)
        assert verify.returncode == 0, verify.stdout + verify.stderr

        assert "nvidia-cu130" not in changed_rows(root)
    finally:
        for ref in made:
            engine.client.api.remove_image(ref, noprune=True)
