"""``docker buildx bake`` alone builds the file ``builder bake`` writes: no builder process runs.

``builder bake`` writes docker-bake.json and stages each target's wheels where its named context
``wheels`` points; then plain ``docker buildx bake -f docker-bake.json cpu`` (the user's buildx,
the real engine) builds the rendered Dockerfile, and the image it leaves passes its contract at
start like one ``builder build`` made.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from helpers import run_builder

from devtools.support import base_pin, copy_project, edit_matrix, retarget_base_lock

pytestmark = [pytest.mark.engine, pytest.mark.classic]


def test_plain_buildx_bake_builds_the_emitted_file(cpu_project, registry, engine, tmp_path, no_leftovers):
    root = tmp_path / "p"
    repo = f"{registry}/bake-standalone"
    copy_project(root)
    edit_matrix(root, registry=repo)
    # BuildKit resolves FROM in the registry: the pinned base goes there first (same image, same digest).
    pinned = base_pin(cpu_project)["reference"]
    engine.client.api.tag(pinned, f"{repo}/base", "bake")
    digest = engine.push(f"{repo}/base:bake")
    retarget_base_lock(cpu_project, root, repo, digest)
    written = run_builder("bake", "-t", "cpu", "-o", str(root / "docker-bake.json"), cwd=root)
    assert written.returncode == 0, written.stderr
    definition = json.loads((root / "docker-bake.json").read_text())
    tags = definition["target"]["cpu"]["tags"]
    docker = shutil.which("docker") or "docker"
    try:
        baked = subprocess.run([docker, "buildx", "bake", "-f", "docker-bake.json", "--progress", "plain", "cpu"],
                               cwd=root, capture_output=True, text=True, timeout=1800, check=False)
        assert baked.returncode == 0, baked.stderr[-3000:]
        image = engine.client.api.inspect_image(tags[0])
        assert image["Config"]["Labels"]["io.ml-image-builder.target"] == "cpu"
        assert image["Config"]["User"] == "1001:1001"
        out = engine.client.containers.run(tags[0], ["python", "-c", "print('BAKED RAN')"], remove=True, stderr=True)
        assert b"[CHECK] pytorch: 2.13.0+cpu -> OK" in out and b"BAKED RAN" in out
    finally:
        for tag in [*tags, f"{repo}/base:bake"]:
            subprocess.run([docker, "image", "rm", tag], capture_output=True, check=False)
