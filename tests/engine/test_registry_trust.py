"""What a registry holds under a content tag counts as built and smoke-tested only by a digest this user's
builder recorded (the ``tested`` ledger) or a signature by a configured key (builder.images.trust).

The registry is the session's, a shared one (anyone with its login pushes, as on a team's registry);
each "user" is a state folder of its own (XDG_CACHE_HOME: its ledger), the wheelhouse shared.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from helpers import load_one_file_image, publish_base_to, run_builder

from builder.oci import registry as oci
from builder.wheels import wheelhouse
from devtools.support import copy_project, host_platform, start_registry, stop

pytestmark = pytest.mark.engine


def _user(tmp_path: Path, name: str, **env: str) -> dict[str, str]:
    """The environment of a user with a state folder (and so a ledger) of its own."""
    return {"XDG_CACHE_HOME": str(tmp_path / f"state-{name}"), "BUILDER_WHEELHOUSE": str(wheelhouse.location()), **env}


def _changed(root: Path, env: dict[str, str]) -> list[str]:
    run = run_builder("matrix", "--changed", "--format", "json", cwd=root, env=env)
    assert run.returncode == 0, run.stderr
    return [row["target"] for row in json.loads(run.stdout)]


@pytest.mark.timeout(1800)
def test_an_image_another_user_pushed_under_our_content_tag_is_built_again(cpu_project, registry, engine,
                                                                            signing_key, tmp_path):
    """Another user pushes an image of theirs under this project's cpu content tag. `build --push --sign-key`
    says so in one line and builds, smoke-tests, pushes and signs its own over it (on main: reused-registry,
    its tags moved onto theirs, and theirs signed). Then the digest this user recorded is reused from the
    registry; another user (an empty ledger) reuses it only with the signing key's public key."""
    root = copy_project(tmp_path / "project")
    doc = yaml.safe_load((cpu_project / "matrix.yaml").read_text())  # this host's platform only
    doc["registry"] = repo = f"{registry}/trust"
    (root / "matrix.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    publish_base_to(engine, cpu_project, root, repo)
    platform = host_platform()
    printed = json.loads(run_builder("print", "-t", "cpu", cwd=root).stdout)["targets"][0]
    content_tag = printed["content_tags"][platform]
    creds = oci.credentials(registry)  # the session's docker login: what every user of the registry has
    a, b = _user(tmp_path, "a"), _user(tmp_path, "b")
    try:
        load_one_file_image(engine, tmp_path / "theirs", platform.split("/")[1], content_tag)
        theirs = engine.push(content_tag)
        engine.client.api.remove_image(content_tag, noprune=True)  # in the registry alone, as on another host
        assert "cpu" in _changed(root, a)  # found, but neither recorded nor signed

        build = run_builder("build", "-t", "cpu", "--push", "--json", "-q", "--sign-key", str(signing_key["private"]),
                            cwd=root, env=a)
        assert build.returncode == 0, build.stderr[-3000:] + build.stdout
        (out,) = json.loads(build.stdout)
        assert (out["result"], out["smoke"]) == ("built", "passed"), out
        assert f"cpu: {content_tag} in the registry ({theirs[:19]}...) was neither smoke-tested by this builder " \
               "nor signed with your key: building it again" in build.stderr
        assert out["digest"] != theirs and oci.manifest_digest(content_tag, creds) == out["digest"]
        for tag in ("cpu", "latest-cpu"):
            assert oci.manifest_digest(f"{repo}:{tag}", creds) == out["digest"]

        engine.client.api.remove_image(content_tag, noprune=True)  # the local content tag gone: the registry decides
        again = run_builder("build", "-t", "cpu", "--json", "-q", cwd=root, env=a)
        assert again.returncode == 0, again.stderr[-3000:]
        assert json.loads(again.stdout)[0]["result"] == "reused-registry"  # the digest a recorded
        assert "cpu" not in _changed(root, a)

        assert "cpu" in _changed(root, b)  # b's ledger is empty, and b names no key
        public = signing_key["public"].read_text()
        assert "cpu" not in _changed(root, {**b, "BUILDER_VERIFY_KEY": public})
        signed = run_builder("build", "-t", "cpu", "--json", "-q", cwd=root, env={**b, "BUILDER_VERIFY_KEY": public})
        assert signed.returncode == 0, signed.stderr[-3000:]
        assert json.loads(signed.stdout)[0]["result"] == "reused-registry"
    finally:
        for tag in [t for image in engine.client.images.list() for t in image.tags if t.startswith(f"{repo}:")]:
            engine.client.api.remove_image(tag, noprune=True)


def test_a_push_to_a_port_another_registry_holds_is_refused(cpu_project, engine, tmp_path):
    """A registry anyone can push to answers on the matrix's loopback port: `build --push` stops before
    building, and `builder push` of an image built earlier pushes nothing, each in one line naming the fix
    (on main both pushed there, and a build took what it found there for tested)."""
    host, proc = start_registry(tmp_path / "theirs")
    root = copy_project(tmp_path / "project")
    doc = yaml.safe_load((cpu_project / "matrix.yaml").read_text())
    built = engine.client.api.inspect_image(f"{doc['registry']}:cpu")["Id"]
    doc["registry"] = repo = f"{host}/ml-runtime"
    (root / "matrix.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    publish_base_to(engine, cpu_project, root, repo)  # anyone can push there; `builder push` wants the base in it
    engine.client.api.tag(built, repo, "cpu")
    try:
        build = run_builder("build", "-t", "cpu", "--push", "--json", cwd=root, env=_user(tmp_path, "a"))
        push = run_builder("push", "-t", "cpu", cwd=root, env=_user(tmp_path, "a"))
        assert oci.manifest_digest(f"{repo}:cpu") is None  # nothing reached it
    finally:
        stop(proc)
        engine.client.api.remove_image(f"{repo}:cpu", noprune=True)
    line = f"another process holds {host}: the registry there answers without a login"
    assert build.returncode == 2, build.stdout + build.stderr
    assert f"error: {line}" in build.stderr and "Traceback" not in build.stderr
    assert "choose another port in matrix.yaml (registry: " in build.stderr
    assert push.returncode == 1 and line in push.stdout + push.stderr, push.stdout + push.stderr
    assert not os.path.exists(root / "dist" / "published.json")
