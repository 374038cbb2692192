"""``builder verify --rebuild``: a consumer rebuilds a published image from its signed provenance.

The cpu image is built (every step run: its wheel layers exported early), pushed and signed from a
git repository (a copy of the project at one commit) on the session's engine (the containerd store). A fresh clone of it then rebuilds that image
on a second, empty engine of each of Docker's stores (a dockerd of its own: another machine's
engine, with no build cache and no image but the base it pulls by digest) and gets every layer and
the configuration of the published image: the engines agree, bit for bit. On the containerd store
the rebuilt image's ID is the published manifest digest; on the classic store (which knows no
manifest until a push) it is the published configuration's digest. One
changed file under runtime/ in that clone makes the rebuild differ, and the differing layer is
named with the file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import docker
import pytest
from helpers import run_builder

from builder.base.blobs import copy_base
from builder.oci import registry as oci
from builder.oci.docker import image_store
from builder.supply import rebuild
from devtools.dockerd import DockerdUnavailable, extra_dockerd
from devtools.support import base_pin, edit_matrix, fail_or_skip, retarget_base_lock

pytestmark = [pytest.mark.engine, pytest.mark.slow]

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_AUTHOR_DATE": "2026-12-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-12-01T00:00:00Z"}


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV})
    return done.stdout.strip()


@pytest.fixture(scope="module")
def published(based_project, registry, signing_key, tmp_path_factory) -> tuple[Path, str]:
    """(the source repository, the signed cpu image's tag): built and pushed from one commit."""
    origin = tmp_path_factory.mktemp("rebuild") / "origin"
    shutil.copytree(based_project, origin, ignore=shutil.ignore_patterns("dist", ".builder"))
    # a repository of its own, so that cpu is built from this commit here, not reused; the base copied there
    repo = f"{registry}/rebuild-me"
    edit_matrix(origin, registry=repo)
    pinned = base_pin(based_project)["reference"]
    assert copy_base(pinned, f"{repo}/base", "bookworm") is not None
    retarget_base_lock(based_project, origin, repo)
    git("init", "-q", "-b", "main", cwd=origin)
    git("add", "-A", cwd=origin)
    git("commit", "-q", "-m", "the published commit", cwd=origin)
    # --rebuild: every step runs, so on the containerd store the wheel layers are exported early (buildx
    # builds beside it): the classic store's rebuild below, which exports nothing early, checks
    # that this changes no byte of the image.
    build = run_builder("build", "-t", "cpu", "--push", "--rebuild", "--json", "-q", "--sign-key",
                        str(signing_key["private"]), cwd=origin)
    assert build.returncode == 0, build.stderr[-3000:] + build.stdout
    [outcome] = json.loads(build.stdout)
    assert outcome["result"] == "built", outcome
    assert ("export: early" in outcome["phases"]) == (image_store(docker.from_env().info()) == "containerd"), outcome
    return origin, f"{registry}/rebuild-me:cpu"


@pytest.mark.parametrize("store", ["containerd", "classic"])
def test_a_fresh_clone_rebuilds_the_published_image_on_another_engine_bit_for_bit(published, signing_key,
                                                                                   tmp_path, store):
    origin, ref = published
    clone = tmp_path / "clone"
    git("clone", "-q", str(origin), str(clone), cwd=tmp_path)
    try:
        with extra_dockerd(tmp_path, "vr", store=store) as host:
            done = run_builder("verify", ref, "--key", str(signing_key["public"]), "--rebuild", cwd=clone,
                               env={"DOCKER_HOST": host}, timeout=1500)
    except DockerdUnavailable as exc:
        fail_or_skip(f"a second dockerd: {exc}")
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout
    [line] = [x for x in done.stdout.splitlines() if re.match(r"(PASS|FAIL) rebuild: ", x)]
    assert line.startswith("PASS rebuild: cpu (linux/") and "the published image" in line, line
    found = re.search(r" gives (\S+): the published image \((\S+)\)", line)
    assert found, f"the rebuild is not the published image itself: {line}"
    gives, published_digest = found.groups()
    if store == "containerd":  # the image ID is the manifest digest: the same manifest, byte for byte
        assert gives == published_digest, line
    else:  # the classic store's ID is the configuration's digest: the registry's, byte for byte
        creds = oci.credentials(oci.Ref.parse(ref).host)  # the session's login
        assert gives == rebuild.published(ref, None, creds).config_digest, line
    assert "config:" not in done.stdout
    assert "this checkout" in done.stderr  # HEAD is the image's commit: no second clone


def test_a_changed_runtime_file_names_the_layer_that_holds_it(published, signing_key, tmp_path):
    origin, ref = published
    clone = tmp_path / "clone"
    git("clone", "-q", str(origin), str(clone), cwd=tmp_path)
    changed = clone / "runtime" / "ml_runtime" / "__init__.py"
    changed.write_text(changed.read_text() + "\n# changed after the image was published\n")
    done = run_builder("verify", ref, "--key", str(signing_key["public"]), "--rebuild", cwd=clone, timeout=1500)
    assert done.returncode == 1, done.stderr[-3000:] + done.stdout
    assert "uncommitted changes are in the rebuild" in done.stderr
    layers = [x for x in done.stdout.splitlines() if re.match(r"FAIL rebuild: cpu \(linux/\w+\) from \w{12}: layer ", x)]
    assert layers, done.stdout
    assert all("ml_runtime" in line and "first difference" in line for line in layers), done.stdout
    assert any("ml_runtime/__init__.py" in line for line in layers), done.stdout
    config = [x for x in done.stdout.splitlines() if ": config: " in x]
    assert config and "org.opencontainers.image.revision" in config[0] and "-dirty" in config[0], done.stdout
