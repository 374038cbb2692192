"""The supply chain on real images: the SBOM is what is really in the image, and a signed push
passes ``builder verify``.

The SBOM (made from the locks and base.lock.json, never from a scan) is compared, name and
version, in both directions, with what the built image holds: the Python distributions its
interpreter sees (``importlib.metadata``) and the Debian packages dpkg records as installed. An
extra or a missing package fails the test and is named.
"""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest
from helpers import cosign_passes, discover, require_peers, run_builder
from packaging.utils import canonicalize_name

from builder.config.project import load_project
from builder.oci import artifacts, registry
from builder.supply import attach, sbom
from devtools.support import registry_of

pytestmark = pytest.mark.engine

#: Run in the image with its own interpreter (the venv's): every distribution it sees, and dpkg's status.
INVENTORY = r"""
import json, importlib.metadata as m
dists = {d.metadata["Name"]: d.version for d in m.distributions()}
debs, fields = {}, {}
for stanza in open("/var/lib/dpkg/status", encoding="utf-8").read().split("\n\n"):
    fields = dict(l.split(": ", 1) for l in stanza.splitlines() if ": " in l and not l.startswith(" "))
    if fields.get("Status") == "install ok installed":
        debs[fields["Package"]] = fields["Version"]
print(json.dumps({"pypi": dists, "deb": debs}))
"""


def inventory(engine: docker.DockerClient, image: str) -> dict[str, dict[str, str]]:
    """{"pypi": {name: version}, "deb": {name: version}} of what *image* really holds."""
    out = engine.client.containers.run(image, ["-c", INVENTORY], entrypoint=["python"], remove=True, network_mode="none")
    found: dict[str, dict[str, str]] = json.loads(out)
    return found


def differences(sbom_packages: dict[str, str], image_packages: dict[str, str], pypi: bool) -> list[str]:
    """Every package the SBOM and the image disagree on, named, in both directions."""
    norm = (lambda n: str(canonicalize_name(n))) if pypi else (lambda n: n)
    listed = {norm(k): v for k, v in sbom_packages.items()}
    there = {norm(k): v for k, v in image_packages.items()}
    problems = [f"in the image, not in the SBOM: {n} {there[n]}" for n in sorted(set(there) - set(listed))]
    problems += [f"in the SBOM, not in the image: {n} {listed[n]}" for n in sorted(set(listed) - set(there))]
    problems += [f"{n}: SBOM says {listed[n]}, the image has {there[n]}"
                 for n in sorted(set(listed) & set(there)) if listed[n] != there[n]]
    return problems


def assert_sbom_is_the_image(root: Path, engine: docker.DockerClient, target_name: str, image: str) -> None:
    project = load_project(root / "matrix.yaml")
    doc = json.loads(sbom.sbom_json(project, project.target(target_name).default_view))
    listed = sbom.packages(doc)
    real = inventory(engine, image)
    assert len(listed["pypi"]) > 20 and len(listed["deb"]) > 100
    problems = differences(listed["pypi"], real["pypi"], pypi=True) + differences(listed["deb"], real["deb"], pypi=False)
    assert not problems, "\n".join(problems)


@pytest.mark.classic
def test_cpu_sbom_is_exactly_what_the_image_holds(cpu_project, engine):
    assert_sbom_is_the_image(cpu_project, engine, "cpu", f"{registry_of(cpu_project)}:cpu")


@pytest.mark.classic
def test_signed_push_of_cpu_passes_verify(cpu_project, signing_key):
    build = run_builder("build", "-t", "cpu", "--push", "--json", "-q", "--sign-key", str(signing_key["private"]),
                        cwd=cpu_project)
    assert build.returncode == 0, build.stderr[-3000:] + build.stdout
    assert signing_key["private"].read_text() not in build.stdout + build.stderr
    record = json.loads((cpu_project / "dist" / "published.json").read_text())["cpu"]
    digest, repo = record["digest"], registry_of(cpu_project)
    assert set(record["attachments"]) == {"sig", "sbom", "att"}
    creds = registry.credentials(repo.split("/", 1)[0])  # the session's docker login
    listed, _ = artifacts.referrers(f"{repo}@{digest}", creds)
    assert {d["digest"] for d in listed} >= set(record["attachments"].values())
    for suffix in ("sig", "att"):  # cosign's own tags
        assert registry.manifest_digest(f"{repo}:sha256-{digest.removeprefix('sha256:')}.{suffix}", creds)
    verify = run_builder("verify", f"{repo}:cpu", "--key", str(signing_key["public"]), cwd=cpu_project)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert [line.split(":")[0] for line in verify.stdout.splitlines()] == ["PASS sig", "PASS sbom", "PASS att"]
    assert all(line.endswith(f"names {repo}@{digest}") for line in verify.stdout.splitlines())
    assert_peers_accept(f"{repo}:cpu", digest, signing_key["public"])


def assert_peers_accept(ref: str, digest: str, public: Path) -> None:
    """What a cluster's admission controller and a user run on the real image, as peers: cosign verify,
    cosign verify-attestation for the SBOM and the provenance, and oras discover (the referrers tag)."""
    require_peers()
    assert cosign_passes(ref, public) == [True, True, True], ref
    repo = ref.rsplit(":", 1)[0]
    assert sorted(d["artifactType"] for d in discover(f"{repo}@{digest}")) == sorted(attach.ARTIFACT_TYPES.values())


def test_push_without_a_key_says_nothing_is_attached(cpu_project):
    build = run_builder("build", "-t", "cpu", "--push", "-q", cwd=cpu_project, env={"BUILDER_SIGNING_KEY": ""})
    assert build.returncode == 0, build.stderr[-3000:]
    assert "note: no signing key (--sign-key or BUILDER_SIGNING_KEY)" in build.stderr


@pytest.mark.heavy
@pytest.mark.timeout(2400)  # builds nvidia-cu130 when test_heavy.py did not run first
def test_nvidia_cu130_signed_push_passes_verify_and_its_sbom_is_the_image(cpu_project, engine, signing_key):
    """The current NVIDIA image (this host's platform): built, pushed with its attachments, verified,
    and its SBOM compared with what it holds; the multi-GB image is removed afterwards."""
    build = run_builder("build", "-t", "nvidia-cu130", "--push", "--json", "-q",
                        "--sign-key", str(signing_key["private"]), cwd=cpu_project, timeout=2300)
    out = json.loads(build.stdout)[0] if build.stdout.strip() else {}
    try:
        assert build.returncode == 0, build.stderr[-3000:]
        repo = registry_of(cpu_project)
        verify = run_builder("verify", f"{repo}:nvidia-cu130", "--key", str(signing_key["public"]), cwd=cpu_project)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert not [line for line in verify.stdout.splitlines() if not line.startswith("PASS ")]
        assert_peers_accept(f"{repo}:nvidia-cu130", out["digest"], signing_key["public"])
        assert_sbom_is_the_image(cpu_project, engine, "nvidia-cu130", out["image_id"])
    finally:
        if out.get("image_id"):
            try:
                engine.client.api.remove_image(out["image_id"], force=True)
            except docker.errors.APIError:
                pass
