"""No credential in anything published or printed (issue 31): a real build, push and signing of cpu
with a login in every place a user or CI puts one, then every byte the registry serves and every
line the builder printed searched for them.

Planted: the cpu index as ``https://ci:<token>@download.pytorch.org/whl/cpu?token=<token>``
(``BUILDER_INDEX_CPU``, as a private mirror is given), the checkout's git remote with a token
(as CI's clones have), the matrix's ``source`` URL with one, and the registry's password
(``BUILDER_REGISTRY_PASSWORD``, an htpasswd registry). Searched: every manifest and blob of the
repository (each tag, cosign's ``.sig``/``.att`` tags, the referrers and every blob they name: image
configs with their labels, layers decompressed, the SBOM, the provenance and the signature
payloads, base64 payloads decoded), the files the build wrote (dist/), and the whole log.

Before issue 31 the provenance held the index URL with its token (matrix_entry.index_url) and
``git+file://<checkout>``, and the source label the matrix's URL as written.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
from helpers import run_builder

from builder.config.project import load_project
from builder.config.wheelmap import index_env_var
from builder.oci import artifacts, registry
from devtools.support import copy_project, edit_matrix, engine_refs_under, native_only, retarget_base_lock

pytestmark = pytest.mark.engine

TOKEN = "tok3n-planted-31"
MANIFESTS = {"application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json",
             "application/vnd.docker.distribution.manifest.v2+json",
             "application/vnd.docker.distribution.manifest.list.v2+json"}


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example"})


def _texts(blob: bytes) -> list[bytes]:
    """*blob* and what it holds: decompressed (gzip, zstd) and, for JSON, every base64 value decoded
    (the DSSE envelopes' payloads: the SBOM and the provenance)."""
    out = [blob]
    if blob[:2] == b"\x1f\x8b":
        out.append(gzip.decompress(blob))
    elif blob[:4] == b"\x28\xb5\x2f\xfd":
        out.append(subprocess.run(["zstd", "-dc"], input=blob, capture_output=True, check=True).stdout)
    for text in [t for t in out if t.lstrip()[:1] == b"{"]:
        for value in re.findall(rb'"([A-Za-z0-9+/]{16,}={0,2})"', text):
            try:
                out.append(base64.b64decode(value, validate=True))
            except ValueError:
                continue
    return out


def _everything(repo: str, creds: dict[str, str]) -> dict[str, bytes]:
    """Every manifest and blob of *repo* the registry serves, by digest (tags, then what they name)."""
    host, name = repo.split("/", 1)
    request = urllib.request.Request(f"http://{host}/v2/{name}/tags/list")
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{creds['username']}:{creds['password']}"
                                                                      .encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as resp:
        tags = json.load(resp)["tags"]
    found: dict[str, bytes] = {}
    todo = [f"{repo}:{tag}" for tag in tags]
    while todo:
        ref = todo.pop()
        got = artifacts.get_manifest(ref, creds)
        assert got is not None, ref
        _, body, digest = got
        if digest in found:
            continue
        found[digest] = body
        doc = json.loads(body)
        # An index lists manifests; BuildKit's registry cache (buildcache-*) lists blobs the same way.
        entries = doc.get("manifests", [])
        todo += [f"{repo}@{m['digest']}" for m in entries if m.get("mediaType") in MANIFESTS]
        listed, _ = artifacts.referrers(f"{repo}@{digest}", creds)
        todo += [f"{repo}@{m['digest']}" for m in listed]
        blobs = [doc.get("config") or {}, *doc.get("layers", []), *(m for m in entries if m.get("mediaType") not in MANIFESTS)]
        for blob in blobs:
            if blob.get("digest") and blob["digest"] not in found:
                data = artifacts.get_blob(repo, blob["digest"], creds)
                assert data is not None, blob
                found[blob["digest"]] = data
    return found


@pytest.mark.timeout(2400)  # with the session's base and cpu build (cpu_project) on a fresh engine
def test_no_credential_in_anything_published_or_printed(cpu_project, auth_registry, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    host, user, password = auth_registry
    repo = f"{host}/no-leak"
    root = copy_project(tmp_path / "project")
    edit_matrix(root, registry=repo, source=f"https://bot:{TOKEN}@github.example/org/images")
    native_only(root)
    retarget_base_lock(cpu_project, root, repo)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "the build's commit")
    _git(root, "remote", "add", "origin", f"https://x-access-token:{TOKEN}@github.example/org/images.git")
    key = tmp_path / "cosign.key"
    key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (tmp_path / "docker-config").mkdir()
    entry = load_project(root / "matrix.yaml").target("cpu").entry
    env = {"DOCKER_CONFIG": str(tmp_path / "docker-config"), "BUILDER_REGISTRY_USER": user,
           "BUILDER_REGISTRY_PASSWORD": password,
           index_env_var(entry): f"https://ci:{TOKEN}@download.pytorch.org/whl/cpu?token={TOKEN}"}

    try:
        build = run_builder("build", "-t", "cpu", "--push", "--json", "--sign-key", str(key), cwd=root, env=env)
    finally:  # the names this build gave under the test's registry (its image's tags, the base's digest) go
        mine = engine_refs_under(repo)
        if mine:
            subprocess.run(["docker", "rmi", *mine], capture_output=True, check=False)
    log = build.stdout + build.stderr
    assert build.returncode == 0, log[-4000:]
    record = json.loads((root / "dist" / "published.json").read_text())["cpu"]
    assert set(record["attachments"]) == {"sig", "sbom", "att"}, record
    for secret in (TOKEN, password):
        assert secret not in log, f"the log holds {secret!r}"

    creds = {"username": user, "password": password}
    published = _everything(repo, creds)
    assert record["digest"] in published and set(record["attachments"].values()) <= set(published)
    kinds = {json.loads(published[d]).get("artifactType") for d in record["attachments"].values()}
    assert len(kinds) == 3, kinds  # the SBOM, the provenance and the signature were searched
    documents = []  # the JSON ones, decoded: configs, manifests, the SBOM, the provenance, signature payloads
    for digest, blob in published.items():
        for text in _texts(blob):
            for secret in (TOKEN.encode(), password.encode()):
                assert secret not in text, f"{digest} holds {secret!r}"
            if text.lstrip()[:1] == b"{" and len(text) < 50_000_000:
                documents.append(text)
    # The provenance names the remote, credential-free, and no local path.
    provenance = b"".join(t for t in documents if b"resolvedDependencies" in t)
    assert b"git+https://github.example/org/images.git" in provenance and str(root).encode() not in provenance
    config = json.loads(next(t for t in documents if b'"org.opencontainers.image.source"' in t and b'"Labels"' in t))
    assert config["config"]["Labels"]["org.opencontainers.image.source"] == "https://github.example/org/images"
    for path in (root / "dist").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert TOKEN.encode() not in data and password.encode() not in data, path
    assert registry.manifest_digest(f"{repo}:cpu", creds) == record["digest"]
