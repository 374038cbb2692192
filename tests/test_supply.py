"""Supply chain without the engine: the SBOM from the real locks, the provenance, DSSE signing, and
``builder verify`` against a real registry (Debian's docker-registry, no referrers API) holding
small images pushed through the registry API: it passes on a signed image and fails, naming the
check, on a re-tag to another digest, copied attachments, a wrong key and a missing attachment."""

from __future__ import annotations

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
from helpers import run_builder
from securesystemslib.signer import CryptoSigner

from builder.config.errors import UserError
from builder.config.project import Project, load_project
from builder.images import publish
from builder.oci import artifacts, registry
from builder.supply import attach, provenance, sbom, signing, verify
from devtools.support import REPO, copy_project, edit_matrix, retarget_base_lock, start_registry, stop

DIGEST = "sha256:" + "ab" * 32


# --- keys ------------------------------------------------------------------------------------------------


def _pem_pair(key: Any) -> tuple[bytes, bytes]:
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    """A throwaway ECDSA P-256 signing key and its public key, and an unrelated Ed25519 public key."""
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
    cpu = repo_project.target("cpu")
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
        sbom.sbom_json(project, project.target("cpu"))


# --- the provenance --------------------------------------------------------------------------------------


def test_provenance_names_the_build(repo_project):
    cpu = repo_project.target("cpu")
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


def test_sign_and_verify_round_trip(keys):
    signer = signing.load_signer(str(keys["private"]))
    assert signer is not None
    data = signing.seal(b'{"x": 1}', "application/json", signer)
    envelope = json.loads(data)
    assert set(envelope) == {"payload", "payloadType", "signatures"}
    assert signing.unseal(data, signing.load_public_key(str(keys["public"]))) == ("application/json", b'{"x": 1}')
    with pytest.raises(signing.BadEnvelope, match="no signature verifies with key"):
        signing.unseal(data, signing.load_public_key(str(keys["other"])))
    forged = json.dumps({**envelope, "payload": "eyJ4IjogMn0="}).encode()  # {"x": 2}, same signature
    with pytest.raises(signing.BadEnvelope, match="no signature verifies"):
        signing.unseal(forged, signing.load_public_key(str(keys["public"])))


def test_key_from_the_environment_and_errors_that_never_show_the_key(keys, tmp_path):
    pem = keys["private"].read_text()
    assert signing.load_signer(None, {"BUILDER_SIGNING_KEY": pem}) is not None
    assert signing.load_signer(None, {}) is None
    with pytest.raises(UserError, match=r"--sign-key /nonexistent/k.pem: cannot read it"):
        signing.load_signer("/nonexistent/k.pem", {})
    garbage = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ1dC1icm9rZW4=\n-----END PRIVATE KEY-----\n"
    with pytest.raises(UserError) as bad:
        signing.load_signer(None, {"BUILDER_SIGNING_KEY": garbage})
    assert "$BUILDER_SIGNING_KEY: not a PEM private key" in str(bad.value)
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
    done = attach.attest(project, project.target("cpu"), f"{name}@{digest}", f"{name}:cpu-0123456789ab", signer)
    return {"root": root, "project": project, "name": name, "digest": digest, "attachments": done, "signer": signer}


def _verify(ref: str, key: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_builder("verify", ref, "--key", str(key), cwd=cwd, timeout=120)


def test_attachments_are_oci_artifacts_under_the_fallback_tags(published):
    name, digest = published["name"], published["digest"]
    assert set(published["attachments"]) == {"sig", "sbom", "att"}
    for kind, attached in published["attachments"].items():
        tag = f"sha256-{digest.removeprefix('sha256:')}.{kind}"
        assert registry.manifest_digest(f"{name}:{tag}") == attached
        media, body, _ = artifacts.get_manifest(f"{name}:{tag}") or ("", b"", "")
        manifest = json.loads(body)
        assert media == artifacts.OCI_MANIFEST
        assert manifest["subject"]["digest"] == digest
        assert manifest["artifactType"] == attach.ARTIFACT_TYPES[kind]
        assert manifest["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
        assert manifest["layers"][0]["mediaType"] == "application/vnd.dsse.envelope.v1+json"
    assert artifacts.referrers(f"{name}@{digest}") is None  # Debian's registry 2.8: no referrers API


def test_verify_passes_on_the_signed_image(published, keys):
    name, digest = published["name"], published["digest"]
    run = _verify(f"{name}:cpu", keys["public"], published["root"])
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["PASS sig", "PASS sbom", "PASS att"]
    assert all(line.endswith(f"names {name}@{digest}") for line in lines)
    count = len(json.loads(sbom.sbom_json(published["project"], published["project"].target("cpu")))["components"])
    assert f"CycloneDX 1.6, {count} components" in lines[1]
    assert "SLSA provenance v1: target cpu (linux/amd64)" in lines[2]
    by_digest = _verify(f"{name}@{digest}", keys["public"], published["root"])
    assert by_digest.returncode == 0, by_digest.stdout + by_digest.stderr


def test_verify_finds_attachments_through_the_referrers_api(published, monkeypatch):
    """Where the registry lists referrers (OCI 1.1), verify takes them from there, not the tags; an
    older attachment signed by another key, listed first, does not hide the good one."""
    subject = f"{published['name']}@{published['digest']}"
    stranger = CryptoSigner.generate_ecdsa()
    stale = artifacts.attach(subject, "stale", signing.ENVELOPE_TYPE,
                             signing.seal(attach.signature_payload(subject), attach.SIMPLE_SIGNING, stranger),
                             artifact_type=attach.SIMPLE_SIGNING)
    listed = [{"digest": stale, "mediaType": artifacts.OCI_MANIFEST, "annotations": {artifacts.KIND_ANNOTATION: "sig"}}]
    listed += [{"digest": d, "mediaType": artifacts.OCI_MANIFEST, "artifactType": attach.ARTIFACT_TYPES[k],
                "annotations": {artifacts.KIND_ANNOTATION: k}} for k, d in published["attachments"].items()]
    monkeypatch.setattr(artifacts, "referrers", lambda subject, creds=None: listed)
    found = artifacts.find_all(subject, "sig", None, artifacts.referrers(subject))
    assert [(a.digest, a.found_by) for a in found] == [(stale, "referrers"), (published["attachments"]["sig"],
                                                                              "referrers")]
    checks = verify.verify(subject, published["signer"].public_key)
    assert [c.line().split(":")[0] for c in checks] == ["PASS sig", "PASS sbom", "PASS att"]
    only_stale = verify.verify(subject, stranger.public_key)
    assert only_stale[0].ok and not only_stale[1].ok and not only_stale[2].ok


def test_verify_fails_on_a_retag_to_another_digest(published, keys):
    name = published["name"]
    other = push_tiny_image(name, "cpu-retagged", "another image")
    run = _verify(f"{name}:cpu-retagged", keys["public"], published["root"])
    assert run.returncode == 1
    hexdigest = other.removeprefix("sha256:")
    assert run.stdout.splitlines() == [
        f"FAIL {kind}: no attachment for {name}@{other} (no tag sha256-{hexdigest}.{kind})"
        for kind in ("sig", "sbom", "att")
    ]


def test_verify_fails_when_the_attachments_are_copied_to_another_digest(published, keys):
    """The tampered tag also gets the signed image's attachments: under its own tags, or re-wrapped."""
    name, signed = published["name"], published["digest"]
    other = push_tiny_image(name, "cpu-copied", "a third image")
    for kind in ("sig", "sbom"):  # the signed image's attachment manifests, as they are
        registry.copy_tag(f"{name}:sha256-{signed.removeprefix('sha256:')}.{kind}",
                          f"sha256-{other.removeprefix('sha256:')}.{kind}")
    # The provenance's envelope, attached anew to the other digest (its manifest's subject is right).
    found = artifacts.find(f"{name}@{signed}", "att")
    assert found is not None
    artifacts.attach(f"{name}@{other}", "att", found.media_type, found.payload, artifact_type=found.artifact_type)
    run = _verify(f"{name}:cpu-copied", keys["public"], published["root"])
    assert run.returncode == 1
    tag = f"sha256-{other.removeprefix('sha256:')}"
    assert run.stdout.splitlines() == [
        f"FAIL sig: the attachment under tag {tag}.sig is attached to {signed}, not {other}",
        f"FAIL sbom: the attachment under tag {tag}.sbom is attached to {signed}, not {other}",
        f"FAIL att: tag {tag}.att: the signed statement is about {signed}, not {other}",
    ]


def test_verify_fails_with_a_wrong_key(published, keys):
    run = _verify(f"{published['name']}:cpu", keys["other"], published["root"])
    assert run.returncode == 1
    other = signing.load_public_key(str(keys["other"])).keyid[:12]
    signer = published["signer"].public_key.keyid[:12]
    tag = f"sha256-{published['digest'].removeprefix('sha256:')}"
    assert run.stdout.splitlines() == [
        f"FAIL {kind}: tag {tag}.{kind}: no signature verifies with key {other} (signed by: {signer})"
        for kind in ("sig", "sbom", "att")
    ]


def test_verify_fails_on_a_missing_attachment(published, keys, tmp_path):
    name = published["name"]
    project = published["project"]
    digest = push_tiny_image(name, "cpu-partial", "a fourth image")
    done = attach.attest(project, project.target("cpu"), f"{name}@{digest}", None, published["signer"])
    artifacts.delete_manifest(name, done["sbom"])
    run = _verify(f"{name}:cpu-partial", keys["public"], published["root"])
    assert run.returncode == 1
    lines = run.stdout.splitlines()
    assert lines[0].startswith("PASS sig:") and lines[2].startswith("PASS att:")
    assert lines[1] == f"FAIL sbom: no attachment for {name}@{digest} (no tag sha256-{digest.removeprefix('sha256:')}.sbom)"


def test_verify_of_an_index_checks_it_and_every_platform(published, keys):
    """A multi-platform target: each platform image carries the three, the index its own signature."""
    name, project, signer = published["name"], published["project"], published["signer"]
    target = project.target("nvidia-cu130")
    pushed = []
    for view in target.views():
        digest = push_tiny_image(name, f"nvidia-cu130-{view.arch}", f"nvidia {view.arch}", view.arch)
        pushed.append((view, digest, None))
    index = registry.put_index(f"{name}:nvidia-cu130", [(v.platform, d) for v, d, _ in pushed])
    publish.record(project.root, [{"target": v.unit, "digest": d} for v, d, _ in pushed]
                   + [{"target": "nvidia-cu130", "digest": index}])
    said: list[str] = []
    assert attach.attest_published(project, pushed, signer, said.append) == {}
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


def test_verify_usage_errors_exit_2_in_one_line(published, tmp_path):
    run = run_builder("verify", f"{published['name']}:cpu", "--key", str(tmp_path / "absent.pub"),
                      cwd=published["root"], timeout=60)
    assert run.returncode == 2
    absent = tmp_path / "absent.pub"
    assert run.stderr.strip().splitlines() == [
        f"error: --key {absent}: cannot read it (No such file or directory); give a readable PEM key file"]
    nokey = run_builder("verify", f"{published['name']}:cpu", cwd=published["root"], timeout=60,
                        env={"BUILDER_VERIFY_KEY": ""})
    assert nokey.returncode == 2 and "no public key: pass --key PUB" in nokey.stderr


def test_pushing_a_signed_image_again_keeps_its_attachments(published):
    """A reused image pushed again (same digest) keeps the documents made when it was first pushed."""
    project, name, digest = published["project"], published["name"], published["digest"]
    said: list[str] = []
    assert attach.attest_published(project, [(project.target("cpu"), digest, None)], published["signer"],
                                   said.append) == {}
    assert said == [f"cpu: {name}@{digest} already carries sig, sbom, att signed by this key"]
    assert attach.already_attested(f"{name}@{digest}", published["signer"]) == published["attachments"]
    assert attach.already_attested(f"{name}@{digest}", CryptoSigner.generate_ecdsa()) == {}


def test_build_attaches_to_each_pushed_outcome_and_fails_the_target_it_cannot(published):
    """What ``builder build --push --sign-key`` does after the build: every outcome with a pushed
    digest gets its attachments; one the registry lacks fails that target, in one line."""
    from builder.cli.images import _attest
    from builder.images.outcome import Outcome

    project, name, signer = published["project"], published["name"], published["signer"]
    digest = push_tiny_image(name, "cpu-built", "a freshly built image")
    cpu = project.target("cpu")
    good = Outcome("cpu", cpu.platform, digest=digest, content_tag=f"{name}:cpu-0123456789ab")
    _attest(project, [cpu], [good], signer)
    assert good.error is None
    assert attach.already_attested(f"{name}@{digest}", signer)
    gone = Outcome("cpu", cpu.platform, digest="sha256:" + "0" * 64)
    _attest(project, [cpu], [gone], signer)
    assert gone.error == (f"attaching the SBOM, provenance and signature failed: registry {name.split('/')[0]} "
                          f"has no {name}@sha256:{'0' * 64} to attach a sig to")
