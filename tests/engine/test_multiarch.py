"""Multi-arch publishing: one OCI image index per tag, read back with skopeo, pulled per platform.

The two images are one-file images for linux/amd64 and linux/arm64, written as docker-archives
the way ``builder base`` writes the base and loaded into the real engine (its classic builder
cannot build a foreign platform FROM scratch). What is checked is the index the builder writes
through the registry API, and how skopeo and the engine resolve it. The emulated build and smoke
test of a real target is in ``test_heavy.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import tarfile

import docker
import pytest
from helpers import load_one_file_image

from builder.oci import registry as oci

pytestmark = [pytest.mark.engine, pytest.mark.classic]
PLATFORMS = ("linux/amd64", "linux/arm64")


def _skopeo(*args: str) -> dict:
    skopeo = shutil.which("skopeo")
    assert skopeo, "skopeo is not installed (scripts/setup-host.sh installs it)"
    proc = subprocess.run([skopeo, *args], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _file_of(engine, ref: str, platform: str) -> str:
    """/arch.txt of the image *ref* names for *platform*, read from a container made of it (never run).

    Store-agnostic: the containerd store keeps every pulled platform under one name (inspect answers
    for the host's), the classic store only the last one pulled; a container gets the platform's own.
    """
    container = engine.client.api.create_container(ref, platform=platform)["Id"]
    try:
        stream, _ = engine.client.api.get_archive(container, "/arch.txt")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile("arch.txt")
            return member.read().decode() if member else ""
    finally:
        engine.client.api.remove_container(container, force=True)


def test_one_index_lists_each_platform_and_each_pull_gets_its_own(engine, registry, tmp_path):
    repo = f"{registry}/multiarch"
    made, digests = [], {}
    try:
        for platform in PLATFORMS:
            arch = platform.split("/")[1]
            ref = f"{repo}:app-{arch}"
            image_id = load_one_file_image(engine, tmp_path / arch, arch, ref)
            assert engine.client.api.inspect_image(ref)["Architecture"] == arch
            made += [ref, image_id]
            digests[platform] = engine.push(ref)
        creds = oci.credentials(registry)  # the session's docker login
        index = oci.put_index(f"{repo}:app", list(digests.items()), creds)
        again = oci.put_index(f"{repo}:app", list(digests.items()), creds)
        assert again == index, "the same images must give the same index digest"

        raw = _skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{repo}:app")
        assert raw["mediaType"] == oci.INDEX_TYPE and raw["schemaVersion"] == 2
        listed = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in raw["manifests"]}
        assert listed == digests
        for platform in PLATFORMS:
            arch = platform.split("/")[1]
            resolved = _skopeo("inspect", "--tls-verify=false", "--override-arch", arch, f"docker://{repo}:app")
            assert resolved["Architecture"] == arch and resolved["Digest"] == index  # the name resolves to the index
            engine.client.api.pull(repo, tag="app", platform=platform, auth_config=creds)
            made.append(f"{repo}:app")
            assert _file_of(engine, f"{repo}:app", platform) == f"{arch}\n"
    finally:
        for ref in reversed(made):
            with contextlib.suppress(docker.errors.ImageNotFound):  # already gone with its other tag
                engine.client.api.remove_image(ref, force=True)
