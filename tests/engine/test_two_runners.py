"""The publish job of .github/workflows/images.yml, run for real on two fresh runners against one registry.

The job's ``run:`` steps are read from the workflow file (never retyped) and executed with
``bash --noprofile --norc -eo pipefail`` (what ``shell: bash`` runs on GitHub), with the job's
``env:`` (and its steps') filled in for the cpu target: TARGET=cpu, IMAGE_REGISTRY pointing at an
htpasswd-protected test registry, its credentials and a signing key (the Environment's secrets). Each runner is a ``dockerd`` of its own
(data root, exec root, socket, bridge) that starts empty, and a checkout of its own.

What the test cannot run, by one rule (:data:`SKIPPED`): ``uses:`` steps (actions/*), and the
steps that provision a GitHub runner (apt-get, sudo sysctl, freeing disk, creating the venv):
this machine has the tools, and each checkout gets the venv the tests run in as ``.venv``.

Scenario: runner A builds, smoke-tests and pushes cpu, and with it the BuildKit cache of every
step (``<repo>:buildcache-cpu-<arch>``); runner B (empty) finds it unchanged and reuses it from
the registry without pulling anything; after a change under runtime/, runner B rebuilds only what
follows the shared stages, those read from the registry cache, and the pinned base pulled by
digest (never bootstrapped).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from builder.oci import registry as oci
from devtools.dockerd import DockerdUnavailable, extra_dockerd
from devtools.support import REPO, base_pin, copy_project, fail_or_skip, host_platform, retarget_base_lock

pytestmark = pytest.mark.engine

WORKFLOW = REPO / ".github" / "workflows" / "images.yml"
#: Steps provisioning a GitHub runner, skipped here (by name prefix), besides every ``uses:`` step.
SKIPPED = ("Free disk space", "System tools", "Install the builder")
#: The job run here: main's, which pushes (pull requests run `build`, which pushes nothing).
JOB = "publish"
SHELL = ["bash", "--noprofile", "--norc", "-eo", "pipefail"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def build_job() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(the env the build job sets, [(step name, script)] of the run: steps the test executes)."""
    doc = yaml.safe_load(WORKFLOW.read_text())
    job = doc["jobs"][JOB]
    shell = (job.get("defaults") or doc.get("defaults") or {}).get("run", {}).get("shell")
    assert shell == "bash", "the test runs steps as `shell: bash` does; the workflow must say so"
    steps = []
    env = {**doc.get("env", {}), **job.get("env", {})}
    for step in job["steps"]:
        if "uses" in step:
            continue
        name = step.get("name") or step["run"].strip().splitlines()[0]
        if name.startswith(SKIPPED):
            continue
        assert "if" not in step, f"step {name!r} has an if: this test does not evaluate conditions"
        assert "shell" not in step and "working-directory" not in step, name
        steps.append((name, step["run"]))
        env.update(step.get("env", {}))  # the secrets each step is given: every step gets them here
    return env, steps


def job_env(spec: dict[str, str], values: dict[str, str]) -> dict[str, str]:
    """The job's env with each ``${{ ... }}`` expression replaced by the test's value for that key."""
    env = {}
    for key, value in spec.items():
        if "${{" in str(value):
            assert key in values, f"the build job's env {key}={value} has no value in this test"
            env[key] = values[key]
        else:
            env[key] = str(value)
    return env


@contextlib.contextmanager
def dockerd(folder: Path, label: str) -> Iterator[str]:
    """A fresh, empty engine for one runner (devtools/dockerd.py), with the containerd image store
    (Engine 29's default: its docker driver exports a registry cache); yields DOCKER_HOST."""
    try:
        with extra_dockerd(folder, label, store="containerd") as host:  # what a new runner installs today
            yield host
    except DockerdUnavailable as exc:
        fail_or_skip(str(exc))


class Runner:
    """One GitHub runner: a checkout of its own, a Docker config of its own, one engine."""

    def __init__(self, source: Path, folder: Path, docker_host: str, env: dict[str, str]) -> None:
        self.root = folder / "checkout"
        shutil.copytree(source, self.root)
        (self.root / ".venv").symlink_to(Path(sys.prefix))  # the venv the "Install the builder" step makes
        github = folder / "github"
        github.mkdir()
        for name in ("output", "env", "summary"):
            (github / name).touch()
        self.summary = github / "summary"
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("DOCKER_", "BUILDER_", "GITHUB_")) and k != "CI"}
        self.env = {**base, **env, "DOCKER_HOST": docker_host, "DOCKER_CONFIG": str(folder / "docker-config"),
                    "GITHUB_OUTPUT": str(github / "output"), "GITHUB_ENV": str(github / "env"),
                    "GITHUB_STEP_SUMMARY": str(self.summary)}
        self.log = ""

    def run(self, steps: list[tuple[str, str]]) -> list[dict]:
        """Every step in order, like the job (the first failure stops it); returns build-cpu-<arch>.json."""
        for name, script in steps:
            path = self.root.parent / "step.sh"
            path.write_text(script)
            proc = subprocess.run([*SHELL, str(path)], cwd=self.root, env=self.env, capture_output=True,
                                  text=True, timeout=1800, check=False)
            self.log += f"\n### {name}\n{ANSI.sub('', proc.stdout + proc.stderr)}"
            assert proc.returncode == 0, f"step {name!r} failed ({proc.returncode}):\n{self.log[-6000:]}"
        return json.loads((self.root / f"build-cpu-{host_platform().split('/')[1]}.json").read_text())

    def published(self) -> dict:
        return json.loads((self.root / "dist" / "published.json").read_text())["cpu"]


def _push_base(engine: docker.DockerClient, reference: str, repo: str, creds: dict[str, str]) -> str:
    """The pinned base, from the main engine, into the test registry (same image: same digest)."""
    engine.client.api.tag(reference, f"{repo}/base", "bookworm")
    for event in engine.client.api.push(f"{repo}/base", "bookworm", auth_config=creds, stream=True, decode=True):
        assert "error" not in event, event
    return oci.manifest_digest(f"{repo}/base:bookworm", creds) or ""  # the containerd store reports none


def _shared_steps(dockerfile: str) -> int:
    """BuildKit's steps (RUN, COPY, ADD, WORKDIR) before the runtime stages (tools, common, wheel-layer-*, torch)."""
    count = 0
    for line in dockerfile.splitlines():
        if line.startswith("FROM ") and " AS runtime" in line:
            return count
        count += line.startswith(("RUN ", "COPY ", "ADD ", "WORKDIR "))
    raise AssertionError("no runtime stage in the Dockerfile")


def test_build_job_on_two_fresh_runners(engine, auth_registry, tmp_path, request):
    host, user, password = auth_registry
    creds = {"username": user, "password": password}
    repo = f"{host}/two-runners"
    tags = [f"{repo}:cpu", f"{repo}:cpu-torch2.13.0", f"{repo}:latest-cpu"]
    spec, steps = build_job()
    key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    env = job_env(spec, {"TARGET": "cpu", "PLATFORM": host_platform(), "IMAGE_REGISTRY": repo,
                         "CONFIGURED_REGISTRY": repo, "DISPATCH_REGISTRY": "",
                         "BUILDER_REGISTRY_USER": user, "BUILDER_REGISTRY_PASSWORD": password,
                         "BUILDER_SIGNING_KEY": key, "COSIGN_PASSWORD": ""})

    # The base this machine bootstraps (never the committed pin: the Debian mirror moves on).
    based = request.getfixturevalue("based_project")
    source = copy_project(tmp_path / "source")  # what actions/checkout gives every runner
    local = base_pin(based)
    pinned = local["reference"].split("@", 1)[1]
    retarget_base_lock(based, source, repo, pinned)
    try:
        assert _push_base(engine, local["reference"], repo, creds) == pinned, \
            "the base pushed elsewhere must keep its digest"
        base_ref = f"{repo}/base@{pinned}"

        # Runner A: empty engine, builds, smoke-tests and pushes.
        with dockerd(tmp_path, "a") as host_a:
            a = Runner(source, tmp_path / "runner-a", host_a, env)
            (built,) = a.run(steps)
            assert built["error"] is None and built["result"] == "built", built
            assert built["smoke"] == "passed" and built["steps"] > 0, built
            content_a = built["content_tag"]
            assert content_a.startswith(f"{repo}:cpu-"), content_a
            for ref in [content_a, *tags]:
                assert oci.manifest_digest(ref, creds) == built["digest"], ref
            record = a.published()
            assert record["digest"] == oci.manifest_digest(content_a, creds) and record["content_tag"] == content_a
            assert set(record["attachments"]) == {"sig", "sbom", "att"}, "the publish job signs and attests"
            assert set(record["tags"]) == {content_a, *tags}, record["tags"]
            assert "bootstrapping" not in a.log and "pulled the locked base" in a.log, a.log[-4000:]
            assert f"Registry: `{repo}`" in a.summary.read_text()
            # --push exported the BuildKit cache of every step beside the images.
            cache = f"{repo}:buildcache-cpu-{host_platform().split('/')[1]}"
            assert oci.manifest_digest(cache, creds) is not None, f"no registry cache at {cache}"

        with dockerd(tmp_path, "b") as host_b, contextlib.closing(docker.DockerClient(base_url=host_b)) as client_b:
            # Runner B: empty engine, unchanged target: reused from the registry, nothing pulled or built.
            assert client_b.images.list(all=True) == []
            b = Runner(source, tmp_path / "runner-b", host_b, env)
            (reused,) = b.run(steps)
            assert reused["error"] is None and reused["result"] == "reused-registry", reused
            assert reused["steps"] == 0 and reused["content_tag"] == content_a, reused
            assert reused["digest"] == built["digest"], reused
            assert client_b.images.list(all=True) == [], "runner B pulled something for an unchanged target"
            assert b.published()["digest"] == oci.manifest_digest(content_a, creds)

            # A change under runtime/: runner B rebuilds after the shared stages, from the registry image.
            init = source / "runtime" / "ml_runtime" / "__init__.py"
            init.write_text(init.read_text() + "# changed by test_two_runners\n")
            b2 = Runner(source, tmp_path / "runner-b2", host_b, env)
            (rebuilt,) = b2.run(steps)
            assert rebuilt["error"] is None and rebuilt["result"] == "built", rebuilt
            content_b = rebuilt["content_tag"]
            assert content_b != content_a and content_b.startswith(f"{repo}:cpu-")
            shared = _shared_steps((b2.root / "images" / "cpu" / "Dockerfile").read_text())
            assert rebuilt["cached_steps"] == shared < rebuilt["steps"], (shared, rebuilt)
            assert rebuilt["cache_read"] == [cache], rebuilt  # the shared steps came from the registry cache
            assert "bootstrapping" not in b2.log and "pulled the locked base" in b2.log, b2.log[-4000:]
            assert base_ref in client_b.api.inspect_image(base_ref)["RepoDigests"]
            for ref in [content_b, *tags]:
                assert oci.manifest_digest(ref, creds) == rebuilt["digest"], ref
            assert rebuilt["digest"] != built["digest"]
            assert oci.manifest_digest(content_a, creds) == built["digest"], "the old content tag stays"
            record = b2.published()
            assert record["digest"] == oci.manifest_digest(content_b, creds) and record["content_tag"] == content_b
            assert set(record["tags"]) == {content_b, *tags}, record["tags"]
    finally:
        with contextlib.suppress(docker.errors.APIError):
            engine.client.api.remove_image(f"{repo}/base:bookworm", noprune=True)
