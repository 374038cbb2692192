"""Supply chain without the engine: the SBOM from the real locks, the provenance, the signing key,
and, against a real registry (Debian's docker-registry, no referrers API) holding small images
pushed through the registry API, what cosign signs and attests: ``cosign verify``,
``cosign verify-attestation`` and ``oras discover`` (run as peers) accept it, and ``builder verify``
agrees with cosign: it passes on a signed image and fails, naming the check, where cosign fails
too: a re-tag to another digest, copied attachments, a wrong key and a deleted attachment."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from helpers import (
    cosign,
    cosign_passes,
    cosign_verify,
    delete_manifest,
    discover,
    require_peers,
    run_builder,
)

from builder.config.errors import UserError
from builder.config.project import Project, load_project
from builder.images import publish
from builder.oci import artifacts, registry
from builder.supply import attach, provenance, sbom, signing
from builder.supply.cosign import KEY_ENV, PREDICATE_TYPES
from devtools.support import (
    REPO,
    copy_project,
    edit_matrix,
    retarget_base_lock,
    start_registry,
    stop,
)

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def tools() -> None:
    """cosign signs (the builder runs it) and, with oras, checks as a peer: required under CI."""
    require_peers()


# --- keys ------------------------------------------------------------------------------------------------


def _pem_pair(key: Any) -> tuple[bytes, bytes]:
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


@pytest.fixture(scope="module")
def keys(tools, tmp_path_factory) -> dict[str, Path]:
    """A throwaway ECDSA P-256 signing key (PEM) and its public key, and an unrelated Ed25519 public key."""
    folder = tmp_path_factory.mktemp("keys")
    private, public = _pem_pair(ec.generate_private_key(ec.SECP256R1()))
    _, other = _pem_pair(ed25519.Ed25519PrivateKey.generate())
    paths = {"private": folder / "cosign.key", "public": folder / "cosign.pub", "other": folder / "other.pub"}
    for name, data in (("private", private), ("public", public), ("other", other)):
        paths[name].write_bytes(data)
    return paths


# --- the SBOM --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def repo_project() -> Project:
    return load_project(REPO / "matrix.yaml")


def test_sbom_from_the_real_locks_is_valid_cyclonedx_and_exact(repo_project):
    cpu = repo_project.target("cpu").default_view
    text = sbom.sbom_json(repo_project, cpu, f"localhost:5000/ml-runtime@{DIGEST}")
    assert sbom.validate(text) is None
    doc = json.loads(text)
    assert doc["specVersion"] == "1.6"
    by_ref = {c["bom-ref"]: c for c in doc["components"]}
    torch = by_ref["pypi:torch"]
    locked = next(line for line in (REPO / "images/cpu/requirements.amd64.lock").read_text().splitlines()
                  if line.startswith("torch=="))
    assert torch["version"] == locked.split("==")[1].split()[0] == cpu.torch_pin  # e.g. 2.13.0+cpu
    assert torch["purl"] == f"pkg:pypi/torch@{cpu.torch_pin.replace('+', '%2B')}"
    assert torch["hashes"] == [{"alg": "SHA-256", "content": locked.split("sha256:")[1].split()[0]}]
    base = json.loads((REPO / "base.lock.json").read_text())["platforms"]["linux/amd64"]
    bsdutils = base["packages"]["bsdutils"]  # e.g. 1:2.38.1-5+deb12u3: the epoch stays, + is quoted
    assert by_ref["deb:bsdutils"]["purl"] == \
        f"pkg:deb/debian/bsdutils@{bsdutils.replace('+', '%2B')}?arch=amd64&distro=bookworm"
    assert by_ref["base"]["version"] == base["reference"].split("@")[1]
    assert by_ref["pypi:ml-runtime"]["version"] == "0.1.0"
    assert doc["metadata"]["component"]["version"] == DIGEST
    assert doc["metadata"]["component"]["hashes"][0]["content"] == DIGEST.removeprefix("sha256:")
    found = sbom.packages(doc)
    assert found["deb"] == base["packages"]
    # Exactly the wheels of common + the target's lock, plus the runtime: never the build-time installer.
    locked_names = {line.split("==")[0].lower() for lock in ("images/common.amd64.lock",
                                                              "images/cpu/requirements.amd64.lock")
                    for line in (REPO / lock).read_text().splitlines() if "==" in line}
    assert set(found["pypi"]) == {n.replace("_", "-") for n in locked_names} | {"ml-runtime"}
    assert "uv" not in found["pypi"]


def test_sbom_of_each_platform_names_its_architecture(repo_project):
    arm = repo_project.target("nvidia-cu130").on("linux/arm64")
    doc = json.loads(sbom.sbom_json(repo_project, arm))
    purls = [c["purl"] for c in doc["components"] if c["purl"].startswith("pkg:deb/")]
    assert purls and all("arch=arm64" in p for p in purls)
    assert [c["name"] for c in doc["components"] if c["name"] == "torch"] == ["torch"]


def test_sbom_names_the_missing_lock(tmp_path):
    root = copy_project(tmp_path / "project")
    (root / "images/cpu/requirements.amd64.lock").unlink()
    project = load_project(root / "matrix.yaml")
    with pytest.raises(UserError, match=r"images/cpu/requirements.amd64.lock is missing or empty: run 'builder "
                                        r"lock -t cpu --platform linux/amd64'"):
        sbom.sbom_json(project, project.target("cpu").default_view)


# --- the provenance --------------------------------------------------------------------------------------


def test_provenance_names_the_build(repo_project):
    cpu = repo_project.target("cpu").default_view
    image = f"localhost:5000/ml-runtime@{DIGEST}"
    st = provenance.statement(repo_project, cpu, image, "localhost:5000/ml-runtime:cpu-0123456789ab")
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://slsa.dev/provenance/v1"
    assert st["subject"] == [{"name": "localhost:5000/ml-runtime", "digest": {"sha256": "ab" * 32}}]
    build = st["predicate"]["buildDefinition"]
    params = build["externalParameters"]
    assert params["matrix_entry"]["name"] == "cpu" and params["matrix_entry"]["torch_pin"] == cpu.torch_pin
    assert params["platform"] == "linux/amd64"
    assert params["content_tag"] == "localhost:5000/ml-runtime:cpu-0123456789ab"
    deps = {d["name"]: d for d in build["resolvedDependencies"]}
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert deps["source"]["digest"] == {"gitCommit": head}
    assert isinstance(deps["source"]["annotations"]["dirty"], bool)
    assert deps["base"]["uri"] == "oci://" + repo_project.base_for("linux/amd64")
    for rel in ("images/common.amd64.lock", "images/cpu/requirements.amd64.lock", "images/cpu/Dockerfile"):
        assert deps[rel]["digest"]["sha256"] == hashlib.sha256((REPO / rel).read_bytes()).hexdigest()
    assert "images/tools.amd64.lock" not in deps
    run = st["predicate"]["runDetails"]
    assert run["builder"]["version"]["ml-image-builder"] == sbom.builder_version()
    assert run["byproducts"] == [{"name": "content-tag", "uri": "oci://localhost:5000/ml-runtime:cpu-0123456789ab"}]


# --- signing ---------------------------------------------------------------------------------------------


def test_a_pem_key_becomes_a_cosign_key_that_cosign_reads(keys, tmp_path):
    """The PEM key is handed to cosign in cosign's format, in memory: cosign derives the same public key."""
    key = signing.load_signer(str(keys["private"]), {})
    assert key is not None
    assert key.public_key.keyid == signing.load_public_key(str(keys["public"])).keyid
    env = key.cosign_env()
    assert env[KEY_ENV].startswith("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----")
    assert keys["private"].read_text() not in repr(key)
    run = cosign("public-key", "--key", f"env://{KEY_ENV}", env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout == keys["public"].read_text()
    for private in (ed25519.Ed25519PrivateKey.generate(), ec.generate_private_key(ec.SECP384R1())):
        pem, public = _pem_pair(private)
        (tmp_path / "k.pem").write_bytes(pem)
        other = signing.load_signer(str(tmp_path / "k.pem"), {})
        assert other is not None
        assert cosign("public-key", "--key", f"env://{KEY_ENV}", env=other.cosign_env()).stdout == public.decode()


def test_cosign_own_key_format_with_its_password(tmp_path):
    """A key from 'cosign generate-key-pair': the password comes from COSIGN_PASSWORD; a wrong one fails at load."""
    made = cosign("generate-key-pair", "--output-key-prefix", str(tmp_path / "cosign"), env={"COSIGN_PASSWORD": "pw1"})
    assert made.returncode == 0, made.stderr
    key = signing.load_signer(str(tmp_path / "cosign.key"), {"COSIGN_PASSWORD": "pw1"})
    assert key is not None
    assert key.public_key.keyid == signing.load_public_key(str(tmp_path / "cosign.pub")).keyid
    text = (tmp_path / "cosign.key").read_text()
    assert signing.load_signer(None, {"BUILDER_SIGNING_KEY": text, "COSIGN_PASSWORD": "pw1"}) is not None
    with pytest.raises(UserError) as wrong:
        signing.load_signer(str(tmp_path / "cosign.key"), {"COSIGN_PASSWORD": "pw2"})
    assert str(wrong.value) == (f"--sign-key {tmp_path / 'cosign.key'}: cosign cannot read the key (decrypt: "
                                "encrypted: decryption failed); set COSIGN_PASSWORD to its password")
    assert text.splitlines()[1] not in str(wrong.value)


def test_key_from_the_environment_and_errors_that_never_show_the_key(keys, tmp_path):
    pem = keys["private"].read_text()
    assert signing.load_signer(None, {"BUILDER_SIGNING_KEY": pem}) is not None
    assert signing.load_signer(None, {}) is None
    with pytest.raises(UserError, match=r"--sign-key /nonexistent/k.pem: cannot read it"):
        signing.load_signer("/nonexistent/k.pem", {})
    garbage = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ1dC1icm9rZW4=\n-----END PRIVATE KEY-----\n"
    with pytest.raises(UserError) as bad:
        signing.load_signer(None, {"BUILDER_SIGNING_KEY": garbage})
    assert "$BUILDER_SIGNING_KEY: not a PEM or cosign private key" in str(bad.value)
    assert "c2VjcmV0" not in str(bad.value)
    encrypted = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pass-phrase"))
    (tmp_path / "enc.pem").write_bytes(encrypted)
    with pytest.raises(UserError, match="the key is encrypted; set BUILDER_SIGNING_KEY_PASSWORD"):
        signing.load_signer(str(tmp_path / "enc.pem"), {})
    assert signing.load_signer(str(tmp_path / "enc.pem"), {"BUILDER_SIGNING_KEY_PASSWORD": "pass-phrase"})
    with pytest.raises(UserError, match=r"no public key: pass --key PUB"):
        signing.load_public_key(None, {})
    with pytest.raises(UserError, match=rf"--key {keys['private']}: not a PEM public key"):
        signing.load_public_key(str(keys["private"]), {})


def test_signing_without_cosign_fails_before_the_build(keys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UserError, match=r"signing needs cosign \(2.x\), which is not installed: 'apt-get install "
                                        r"cosign'"):
        signing.load_signer(str(keys["private"]), {})


# --- attached in a registry, and builder verify ----------------------------------------------------------


@pytest.fixture(scope="module")
def deleting_registry(tmp_path_factory) -> Iterator[str]:
    """A registry of this module's own that allows deletes (an attachment is removed)."""
    try:
        host, proc = start_registry(tmp_path_factory.mktemp("supply-registry"), delete=True)
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}; .ci/run installs it")
    yield host
    stop(proc)


def _verify(ref: str, key: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_builder("verify", ref, "--key", str(key), cwd=cwd, timeout=120)


def push_tiny_image(name: str, tag: str, text: str, arch: str = "amd64") -> str:
    """Push a one-layer OCI image (one file holding *text*) under name:tag through the registry API; its digest."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        data = text.encode()
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    layer = gzip.compress(raw.getvalue(), mtime=0)
    config = json.dumps({"architecture": arch, "os": "linux", "rootfs": {
        "type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": artifacts.OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": artifacts.push_blob(name, config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": artifacts.push_blob(name, layer), "size": len(layer)}],
    }).encode()
    return artifacts.put_manifest(name, tag, manifest, artifacts.OCI_MANIFEST)


@pytest.fixture(scope="module")
def published(deleting_registry, keys, tmp_path_factory) -> dict[str, Any]:
    """A project publishing to the module's registry, and its cpu "image" pushed and attested there."""
    root = copy_project(tmp_path_factory.mktemp("supply") / "project")
    name = f"{deleting_registry}/ml-runtime"
    edit_matrix(root, registry=name)
    retarget_base_lock(REPO, root, name)
    project = load_project(root / "matrix.yaml")
    digest = push_tiny_image(name, "cpu", "the cpu image")
    signer = signing.load_signer(str(keys["private"]))
    assert signer is not None
    done = attach.attest(project, project.target("cpu").default_view, f"{name}@{digest}", f"{name}:cpu-0123456789ab", signer)
    return {"root": root, "project": project, "name": name, "digest": digest, "attachments": done, "signer": signer}


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def _manifest(ref: str) -> dict[str, Any]:
    found = artifacts.get_manifest(ref)
    assert found is not None, f"no {ref}"
    doc: dict[str, Any] = json.loads(found[1])
    return doc


def test_cosign_verifies_the_signature_and_both_attestations(published, keys):
    """What an admission controller runs: cosign verify and verify-attestation, for the SBOM and the provenance."""
    ref = f"{published['name']}@{published['digest']}"
    run = cosign_verify(ref, keys["public"], "sig")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)[0]["critical"]["image"]["docker-manifest-digest"] == published["digest"]
    for kind, predicate_type in (("sbom", "https://cyclonedx.org/bom"), ("att", "https://slsa.dev/provenance/v1")):
        run = cosign_verify(ref, keys["public"], kind)
        assert run.returncode == 0, run.stderr
        statement = json.loads(base64.b64decode(json.loads(run.stdout.splitlines()[0])["payload"]))
        assert statement["predicateType"] == predicate_type
        assert statement["subject"][0]["digest"] == {"sha256": _hex(published["digest"])}
        if kind == "sbom":  # the SBOM exactly as the builder made it
            made = json.loads(sbom.sbom_json(published["project"], published["project"].target("cpu").default_view, ref))
            assert {k: v for k, v in statement["predicate"].items() if k != "serialNumber"} == \
                {k: v for k, v in made.items() if k != "serialNumber"} | {"metadata": statement["predicate"]["metadata"]}
            assert [c["bom-ref"] for c in statement["predicate"]["components"]] == \
                [c["bom-ref"] for c in made["components"]]
        else:
            assert statement["predicate"]["buildDefinition"]["externalParameters"]["target"] == "cpu"


def test_oras_discover_lists_the_attachments_by_the_referrers_tag(published):
    """Debian's registry has no referrers API: the index under tag sha256-<hex> lists one referrer
    per kind, each with the image as subject, and oras reads it."""
    name, digest = published["name"], published["digest"]
    assert set(published["attachments"]) == {"sig", "sbom", "att"}
    found = discover(f"{name}@{digest}")
    assert sorted((d["artifactType"], d["digest"]) for d in found) == sorted(
        (attach.ARTIFACT_TYPES[kind], attached) for kind, attached in published["attachments"].items())
    listed, where = artifacts.referrers(f"{name}@{digest}")
    assert where == f"tag sha256-{_hex(digest)}"
    assert {d["digest"] for d in listed} == set(published["attachments"].values())
    tags = _manifest(f"{name}:sha256-{_hex(digest)}.sig"), _manifest(f"{name}:sha256-{_hex(digest)}.att")
    for kind, attached in published["attachments"].items():
        manifest = _manifest(f"{name}@{attached}")
        assert manifest["subject"]["digest"] == digest
        assert manifest["annotations"][artifacts.KIND_ANNOTATION] == kind
        # the very layer cosign wrote under its own tag (its signature, or its DSSE envelope)
        assert manifest["layers"][0] in tags[0 if kind == "sig" else 1]["layers"]


def test_put_referrer_leaves_the_index_to_a_registry_with_the_referrers_api(published, monkeypatch):
    """A registry that answers a manifest with a subject with OCI-Subject indexes it itself: no tag index."""
    subject = f"{published['name']}@{published['digest']}"
    real = artifacts._request

    def with_api(method, url, host, creds, headers, data=None):
        status, got, body = real(method, url, host, creds, headers, data)
        if method == "PUT" and "/manifests/sha256:" in url:
            got = {**got, "OCI-Subject": published["digest"]}
        return status, got, body

    monkeypatch.setattr(artifacts, "_request", with_api)
    other = push_tiny_image(published["name"], "cpu-api", "an image on an API registry")
    manifest = {**_manifest(f"{published['name']}@{published['attachments']['sbom']}"),
                "subject": {"mediaType": artifacts.OCI_MANIFEST, "digest": other, "size": 1}}
    artifacts.put_referrer(f"{published['name']}@{other}", manifest)
    assert artifacts.get_manifest(f"{published['name']}:sha256-{_hex(other)}") is None
    assert artifacts.referrers(subject)[0]  # the signed image's index is untouched


def test_verify_passes_on_the_signed_image(published, keys):
    name, digest = published["name"], published["digest"]
    run = _verify(f"{name}:cpu", keys["public"], published["root"])
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["PASS sig", "PASS sbom", "PASS att"]
    assert all(line.endswith(f"names {name}@{digest}") for line in lines)
    count = len(json.loads(sbom.sbom_json(published["project"], published["project"].target("cpu").default_view))["components"])
    assert f"CycloneDX 1.6, {count} components" in lines[1]
    assert "SLSA provenance v1: target cpu (linux/amd64)" in lines[2]
    by_digest = _verify(f"{name}@{digest}", keys["public"], published["root"])
    assert by_digest.returncode == 0, by_digest.stdout + by_digest.stderr
    assert cosign_passes(f"{name}:cpu", keys["public"]) == [True, True, True]


def test_verify_fails_on_a_retag_to_another_digest(published, keys):
    name = published["name"]
    other = push_tiny_image(name, "cpu-retagged", "another image")
    run = _verify(f"{name}:cpu-retagged", keys["public"], published["root"])
    assert run.returncode == 1
    tag = f"sha256-{_hex(other)}"
    assert run.stdout.splitlines() == [
        f"FAIL sig: no signature for {name}@{other} (no tag {tag}.sig)",
        f"FAIL sbom: no attestation for {name}@{other} (no tag {tag}.att)",
        f"FAIL att: no attestation for {name}@{other} (no tag {tag}.att)",
    ]
    assert cosign_passes(f"{name}:cpu-retagged", keys["public"]) == [False, False, False]


def test_verify_fails_when_the_attachments_are_copied_to_another_digest(published, keys):
    """The tampered image gets the signed image's signature and attestations under its own cosign tags."""
    name, signed = published["name"], published["digest"]
    other = push_tiny_image(name, "cpu-copied", "a third image")
    for suffix in ("sig", "att"):
        registry.copy_tag(f"{name}:sha256-{_hex(signed)}.{suffix}", f"sha256-{_hex(other)}.{suffix}")
    run = _verify(f"{name}:cpu-copied", keys["public"], published["root"])
    assert run.returncode == 1
    tag = f"sha256-{_hex(other)}"
    assert run.stdout.splitlines() == [
        f"FAIL sig: tag {tag}.sig: the signature is for {signed}, not {other}",
        f"FAIL sbom: tag {tag}.att: the signed statement is about {signed}, not {other}",
        f"FAIL att: tag {tag}.att: the signed statement is about {signed}, not {other}",
    ]
    assert cosign_passes(f"{name}:cpu-copied", keys["public"]) == [False, False, False]


def test_verify_fails_with_a_wrong_key(published, keys):
    run = _verify(f"{published['name']}:cpu", keys["other"], published["root"])
    assert run.returncode == 1
    other = signing.load_public_key(str(keys["other"])).keyid[:12]
    tag = f"sha256-{_hex(published['digest'])}"
    assert run.stdout.splitlines() == [
        f"FAIL sig: tag {tag}.sig: no signature verifies with key {other}",
        f"FAIL sbom: tag {tag}.att: no attestation verifies with key {other}",
        f"FAIL att: tag {tag}.att: no attestation verifies with key {other}",
    ]
    assert cosign_passes(f"{published['name']}:cpu", keys["other"]) == [False, False, False]


def test_verify_fails_on_a_deleted_attachment(published, keys):
    """The attestations deleted (cosign keeps both in one manifest): the signature still verifies, for both."""
    name, project = published["name"], published["project"]
    digest = push_tiny_image(name, "cpu-partial", "a fourth image")
    attach.attest(project, project.target("cpu").default_view, f"{name}@{digest}", None, published["signer"])
    assert cosign_passes(f"{name}:cpu-partial", keys["public"]) == [True, True, True]
    delete_manifest(f"{name}:sha256-{_hex(digest)}.att")
    run = _verify(f"{name}:cpu-partial", keys["public"], published["root"])
    assert run.returncode == 1
    lines = run.stdout.splitlines()
    assert lines[0].startswith("PASS sig:")
    assert lines[1:] == [f"FAIL {kind}: no attestation for {name}@{digest} (no tag sha256-{_hex(digest)}.att)"
                         for kind in ("sbom", "att")]
    assert cosign_passes(f"{name}:cpu-partial", keys["public"]) == [True, False, False]


def test_verify_fails_on_a_deleted_signature(published, keys):
    name, project = published["name"], published["project"]
    digest = push_tiny_image(name, "cpu-unsigned", "a fifth image")
    attach.attest(project, project.target("cpu").default_view, f"{name}@{digest}", None, published["signer"])
    delete_manifest(f"{name}:sha256-{_hex(digest)}.sig")
    run = _verify(f"{name}:cpu-unsigned", keys["public"], published["root"])
    assert run.returncode == 1
    assert run.stdout.splitlines()[0] == \
        f"FAIL sig: no signature for {name}@{digest} (no tag sha256-{_hex(digest)}.sig)"
    assert [line.split(":")[0] for line in run.stdout.splitlines()[1:]] == ["PASS sbom", "PASS att"]
    assert cosign_passes(f"{name}:cpu-unsigned", keys["public"]) == [False, True, True]


def test_verify_of_an_index_checks_it_and_every_platform(published, keys):
    """A multi-platform target: each platform image carries the three, the index its own signature;
    cosign verifies each, and oras finds each one's referrers. Attached by the executor's ``attest``
    stage (:class:`attach.Attach`), each view's then the index's, and recorded with the records."""
    name, project, signer = published["name"], published["project"], published["signer"]
    target = project.target("nvidia-cu130")
    pushed = []
    for view in target.views():
        digest = push_tiny_image(name, f"nvidia-cu130-{view.arch}", f"nvidia {view.arch}", view.arch)
        pushed.append((view, digest, None))
    index = registry.put_index(f"{name}:nvidia-cu130", [(v.platform, d) for v, d, _ in pushed])
    said: list[str] = []
    stage = attach.Attach(project, signer, said.append)
    publish.record(project.root, [{"target": v.unit, "digest": d, "attachments": stage.image(v, d, tag)}
                                  for v, d, tag in pushed]
                   + [{"target": "nvidia-cu130", "digest": index, "attachments": stage.index(target, index)}])
    assert said[-1] == f"nvidia-cu130: signed the index {name}@{index}"
    records = json.loads((project.root / "dist/published.json").read_text())
    assert set(records["nvidia-cu130 (linux/arm64)"]["attachments"]) == {"sig", "sbom", "att"}
    assert set(records["nvidia-cu130"]["attachments"]) == {"sig"}
    run = _verify(f"{name}:nvidia-cu130", keys["public"], published["root"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert [line.split(":")[0] for line in run.stdout.splitlines()] == [
        "PASS sig [index]",
        "PASS sig [linux/amd64]", "PASS sbom [linux/amd64]", "PASS att [linux/amd64]",
        "PASS sig [linux/arm64]", "PASS sbom [linux/arm64]", "PASS att [linux/arm64]",
    ]
    run = cosign_verify(f"{name}:nvidia-cu130", keys["public"], "sig")  # the index by its tag
    assert run.returncode == 0, run.stderr
    assert [d["artifactType"] for d in discover(f"{name}:nvidia-cu130")] == [attach.COSIGN_SIG_ARTIFACT]
    for view, digest, _ in pushed:
        assert cosign_passes(f"{name}@{digest}", keys["public"]) == [True, True, True], view.unit
        assert sorted(d["artifactType"] for d in discover(f"{name}@{digest}")) == sorted(attach.ARTIFACT_TYPES.values())


def test_verify_usage_errors_exit_2_in_one_line(published, tmp_path):
    run = run_builder("verify", f"{published['name']}:cpu", "--key", str(tmp_path / "absent.pub"),
                      cwd=published["root"], timeout=60)
    assert run.returncode == 2
    absent = tmp_path / "absent.pub"
    assert run.stderr.strip().splitlines() == [
        f"error: --key {absent}: cannot read it (No such file or directory); give a readable key file"]
    nokey = run_builder("verify", f"{published['name']}:cpu", cwd=published["root"], timeout=60,
                        env={"BUILDER_VERIFY_KEY": ""})
    assert nokey.returncode == 2 and "no public key: pass --key PUB" in nokey.stderr


def test_pushing_a_signed_image_again_keeps_its_attachments(published):
    """A reused image pushed again (same digest) keeps the documents made when it was first pushed."""
    project, name, digest = published["project"], published["name"], published["digest"]
    said: list[str] = []
    stage = attach.Attach(project, published["signer"], said.append)  # the executor's attest stage
    assert stage.image(project.target("cpu").default_view, digest, None) == published["attachments"]
    assert said == [f"cpu: {name}@{digest} already carries sig, sbom, att signed by this key"]
    assert attach.already_attested(f"{name}@{digest}", published["signer"]) == published["attachments"]
    (published["root"] / "stranger.pem").write_bytes(_pem_pair(ec.generate_private_key(ec.SECP256R1()))[0])
    stranger = signing.load_signer(str(published["root"] / "stranger.pem"), {})
    assert stranger is not None and attach.already_attested(f"{name}@{digest}", stranger) == {}


def test_signing_again_does_not_pile_up(published, keys):
    """Signed and attested again (say, a referrer was lost): still one signature, one attestation of
    each type, one referrer of each kind; cosign's and oras's views unchanged."""
    name, project = published["name"], published["project"]
    digest = push_tiny_image(name, "cpu-again", "a sixth image")
    image = f"{name}@{digest}"
    first = attach.attest(project, project.target("cpu").default_view, image, None, published["signer"])
    again = attach.attest(project, project.target("cpu").default_view, image, None, published["signer"])
    assert again["sig"] == first["sig"]  # cosign added no second signature: the same referrer
    assert len(_manifest(f"{name}:sha256-{_hex(digest)}.sig")["layers"]) == 1
    layers = _manifest(f"{name}:sha256-{_hex(digest)}.att")["layers"]
    assert sorted(la["annotations"]["predicateType"] for la in layers) == sorted(PREDICATE_TYPES.values())
    assert sorted(d["digest"] for d in discover(image)) == sorted(again.values())
    assert cosign_passes(image, keys["public"]) == [True, True, True]


def test_the_attest_stage_attaches_to_a_pushed_image_and_fails_in_one_line_where_it_cannot(published):
    """The ``attest`` stage ``builder build --push --sign-key`` and ``builder push`` run after a view's
    push: the pushed digest gets its attachments; one the registry lacks fails, in one line (the
    executor makes it that view's error: tests/test_build_unit.py)."""
    from builder.config.errors import TargetFailed

    project, name, signer = published["project"], published["name"], published["signer"]
    digest = push_tiny_image(name, "cpu-built", "a freshly built image")
    cpu = project.target("cpu").default_view
    said: list[str] = []
    stage = attach.Attach(project, signer, said.append)
    done = stage.image(cpu, digest, f"{name}:cpu-0123456789ab")
    assert set(done) == {"sig", "sbom", "att"} and said == [f"cpu: signed and attached sig, sbom, att to {name}@{digest}"]
    assert attach.already_attested(f"{name}@{digest}", signer)
    with pytest.raises(TargetFailed) as failed:
        stage.image(cpu, "sha256:" + "0" * 64, None)
    assert str(failed.value) == (f"attaching the SBOM, provenance and signature failed: registry {name.split('/')[0]} "
                                 f"has no {name}@sha256:{'0' * 64} to attach a sig to")


def test_provenance_names_the_commit_the_image_says_it_was_built_at(repo_project):
    """A reused image (its content tag found) was built at an earlier commit: the provenance names that one,
    which is what a rebuild checks out, never the checkout's HEAD."""
    cpu = repo_project.target("cpu").default_view
    image = f"localhost:5000/ml-runtime@{DIGEST}"
    for label, commit, dirty in (("1" * 40, "1" * 40, False), ("2" * 40 + "-dirty", "2" * 40, True)):
        st = provenance.statement(repo_project, cpu, image, None, built_at=label)
        source = st["predicate"]["buildDefinition"]["resolvedDependencies"][0]
        assert source["digest"] == {"gitCommit": commit} and source["annotations"] == {"dirty": dirty}
