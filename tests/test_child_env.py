"""Every child process the builder starts gets the environment its tool reads, and no secret it does not
use (issue 40).

Planted in this process's environment: the registry login, the signing key and its password,
cosign's, a secret of no tool's (a cloud key), a zstd setting that would change a digest, and the
settings each tool does read (DOCKER_HOST, PIP_*, UV_*, ...). Each child is a real process: a recorder
(a shell script) stands where the builder looks for the tool (on PATH, or as ``sys.executable`` for
pip and ``find_uv_bin`` for uv) and keeps its own ``/proc/self/cmdline`` and ``/proc/self/environ``,
which is exactly what the builder handed it, then runs the real tool where the builder needs its
answer (pip, uv, git, zstd, hadolint), else answers as the test needs. Every record is searched for
the planted secrets; an index's and a mirror's login must be on no command line.

Before issue 40, pip got ``--extra-index-url <url with login>`` on its command line, mmdebstrap the
mirror with its login, and docker-registry, ``podman system service``, ``buildx prune``,
``docker context inspect``, pip, uv, mmdebstrap, git, hadolint, zstd and sbatch the whole environment.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from builder.config.errors import TargetFailed, UserError
from builder.config.project import load_project
from builder.oci import secrets
from builder.oci.engine import BuildRequest
from builder.wheels.lockfile import Pin
from devtools.support import copy_project, free_port, host_platform

TOKEN = "tok3n-planted-40"
#: The builder's own secrets: no child gets one (cosign gets the key it signs with as an extra, on its own).
OWN = {name: f"{TOKEN}-{name}" for name in sorted(secrets.SECRET_ENV)}
#: A secret no tool here reads: only sbatch's job (the user's environment, as Slurm passes it) gets it.
CLOUD = {"AWS_SECRET_ACCESS_KEY": f"{TOKEN}-aws", "GITHUB_TOKEN": f"{TOKEN}-gh"}
#: What some tool reads: each must reach that tool.
NEEDED = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "BUILDX_BUILDER": "planted-builder",
          "PIP_DEFAULT_TIMEOUT": "31", "UV_CONCURRENT_DOWNLOADS": "3", "ZSTD_NBTHREADS": "4",
          "CONTAINERS_CONF": "/nonexistent/containers.conf", "LANG": "C.UTF-8"}
LOGIN = f"https://ci:{TOKEN}-index@127.0.0.1:9/simple"


@dataclass
class Record:
    tool: str
    argv: list[str]
    env: dict[str, str]

    def leaks(self, *allowed: str) -> list[str]:
        """The planted secrets this child was given, by name (*allowed*: those it may have)."""
        text = "\0".join(self.argv)
        found = [name for name, value in {**OWN, **CLOUD}.items()
                 if name not in allowed and (value in text or value in self.env.values())]
        return found + ([f"a login on the command line: {text}"] if TOKEN in text else [])


class Recorders:
    """Recording stand-ins for the builder's tools, each in *folder*/bin (on PATH) unless named elsewhere."""

    def __init__(self, folder: Path) -> None:
        self.bin, self.out = folder / "bin", folder / "records"
        self.bin.mkdir()
        self.out.mkdir()

    def add(self, name: str, then: str = "exit 1", path: Path | None = None) -> Path:
        """A recorder for *name*: it keeps its argv and environment, then runs the shell code *then*
        (``exec <the real tool> "$@"``, or an answer of its own)."""
        script = path or self.bin / name
        script.write_text("#!/bin/sh\n"
                          f'out=$(/bin/mktemp -d "{self.out}/{name}.$(/bin/date +%s%N).XXXXXX")\n'
                          '/bin/cat /proc/$$/cmdline > "$out/cmdline"\n'
                          '/bin/cat /proc/$$/environ > "$out/environ"\n'
                          f"{then}\n")
        script.chmod(0o755)
        return script

    def real(self, name: str) -> str:
        """``exec`` of the tool *name* found on PATH before the recorders were put in front of it."""
        found = shutil.which(name, path=os.environ["PATH"].replace(f"{self.bin}:", ""))
        if found is None:
            pytest.skip(f"{name} is not installed")
        return f'exec {found} "$@"'

    def records(self, tool: str) -> list[Record]:
        """What each run of *tool* was given, in the order they ran."""
        found = []
        for folder in sorted(self.out.glob(f"{tool}.*")):
            argv = (folder / "cmdline").read_bytes().decode().split("\0")[2:-1]  # after /bin/sh and the script
            pairs = (folder / "environ").read_bytes().decode().split("\0")
            found.append(Record(tool, argv, dict(p.split("=", 1) for p in pairs if "=" in p)))
        assert found, f"{tool} never ran"
        return found


@pytest.fixture
def recorders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorders]:
    rec = Recorders(tmp_path)
    monkeypatch.setenv("PATH", f"{rec.bin}:{os.environ['PATH']}")
    for name, value in {**OWN, **CLOUD, **NEEDED}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the state folder: the test's own
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(tmp_path / "wheels"))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))  # no credential helper: none named
    yield rec


def _clean(records: list[Record], *needed: str, allowed: tuple[str, ...] = ()) -> None:
    for record in records:
        assert not record.leaks(*allowed), (record.tool, record.leaks(*allowed))
        missing = [name for name in needed if record.env.get(name) != os.environ[name]]
        assert not missing, (record.tool, missing)


def test_pip_gets_the_index_login_in_a_private_file_and_no_secret(recorders, tmp_path, monkeypatch):
    """``pip config list`` and ``pip download`` (the real pip, started as the builder's own Python):
    the target's index, given with its login, is in neither's command line (before: ``--extra-index-url
    <url with login>``, which every local user reads in /proc)."""
    from builder.wheels import resolve

    monkeypatch.setattr(sys, "executable", str(recorders.add("python", f'exec {sys.executable} "$@"',
                                                             tmp_path / "python")))
    project = load_project(copy_project(tmp_path / "project") / "matrix.yaml")
    pin = Pin("numpy", "1.26.4", "0" * 64, "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl")
    with pytest.raises(TargetFailed):
        resolve.fetch_locked(project, [pin], tmp_path / "x.lock", LOGIN, "linux/amd64")
    resolve.pip_sources()
    records = recorders.records("python")
    assert any("download" in r.argv for r in records) and any("config" in r.argv for r in records)
    _clean(records, "PIP_DEFAULT_TIMEOUT", "LANG")
    assert not any("DOCKER_HOST" in r.env or "ZSTD_NBTHREADS" in r.env for r in records)


def test_uv_gets_the_index_login_in_a_private_file_and_no_secret(recorders, tmp_path, monkeypatch):
    from uv import find_uv_bin

    from builder.wheels import resolve

    monkeypatch.setattr(resolve, "find_uv_bin", lambda: str(recorders.add("uv", f'exec {find_uv_bin()} "$@"')))
    project = load_project(copy_project(tmp_path / "project") / "matrix.yaml")
    with pytest.raises(TargetFailed):
        resolve.resolve(project, ["numpy"], "linux/amd64", vendor_index=LOGIN)
    records = recorders.records("uv")
    _clean(records, "UV_CONCURRENT_DOWNLOADS", "LANG")
    assert records[0].env["UV_NO_PROGRESS"] == "1"


def test_git_gets_no_secret(recorders, tmp_path):
    """git, for the revision label and the provenance's source."""
    from builder.images import plan
    from builder.supply import provenance

    recorders.add("git", recorders.real("git"))
    root = copy_project(tmp_path / "project")
    plan.build_labels(root)
    provenance.git_state(root)
    provenance.git_remote(root)
    records = recorders.records("git")
    assert len(records) >= 4
    _clean(records, "LANG")
    assert not any("GITHUB_TOKEN" in r.env for r in records)


def test_hadolint_gets_no_secret(recorders, tmp_path, monkeypatch):
    from builder.images import lint

    real = lint.hadolint_binary()
    monkeypatch.setattr(lint, "hadolint_binary", lambda: str(recorders.add("hadolint", f'exec {real} "$@"')))
    project = load_project(copy_project(tmp_path / "project") / "matrix.yaml")
    assert lint.lint(project, [project.target("cpu")]) == []
    _clean(recorders.records("hadolint"), "LANG")


def test_mmdebstrap_gets_no_secret_and_the_mirror_without_its_login(recorders, tmp_path):
    """mmdebstrap (a recorder that fails: the real bootstrap is the slow test below) is given the mirror
    credential-free, SOURCE_DATE_EPOCH and a locale and time zone of ours; the file holding the login is
    gone after."""
    from builder.base import bootstrap as base

    recorders.add("mmdebstrap")
    spec = load_project(copy_project(tmp_path / "project") / "matrix.yaml").matrix.base.bootstrap
    assert spec is not None
    spec = spec.model_copy(update={"mirror": f"http://ci:{TOKEN}-mirror@127.0.0.1:9/debian"})
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(UserError, match="mmdebstrap failed") as failed:
        base.bootstrap(spec, work, host_platform())
    assert TOKEN not in str(failed.value)
    (record,) = recorders.records("mmdebstrap")
    _clean([record])
    assert record.argv[-1] == "http://127.0.0.1:9/debian"
    assert record.env["SOURCE_DATE_EPOCH"] == str(spec.source_date_epoch)
    assert (record.env["LANG"], record.env["TZ"]) == ("C.UTF-8", "UTC"), "the caller's locale and time zone stay"
    assert "DOCKER_HOST" not in record.env and "ZSTD_NBTHREADS" not in record.env
    assert list(work.iterdir()) == [], "the login's file is removed"


def test_docker_registry_gets_nothing_of_the_users(recorders, tmp_path):
    """The loopback registry (a daemon that outlives the run) and its garbage-collect."""
    from builder.oci import localregistry

    recorders.add("docker-registry")
    with pytest.raises(UserError, match="did not start"):
        localregistry.ensure_local(f"127.0.0.1:{free_port()}")
    localregistry.unreferenced_blobs(tmp_path)
    records = recorders.records("docker-registry")
    assert [r.argv[0] for r in records] == ["serve", "garbage-collect"]
    _clean(records, "LANG")
    assert not any("DOCKER_HOST" in r.env or "PIP_DEFAULT_TIMEOUT" in r.env for r in records)


def test_docker_and_buildx_get_the_engine_and_no_secret(recorders, tmp_path):
    """``docker buildx version``/``inspect``, ``docker context inspect``, ``buildx build`` (with the
    registry's login: a private DOCKER_CONFIG, never the password itself) and ``buildx prune``."""
    from builder.oci import buildkit
    from builder.oci.docker import DockerAPI, DockerEngine

    # the build fails, so the builder asks `buildx version` why (it does not before a build)
    recorders.add("docker", 'echo "Driver: docker"; [ "$1 $2" = "buildx build" ] && exit 1; exit 0')
    assert buildkit.builder_problem("planted-builder", "unix:///elsewhere.sock") is not None
    request = BuildRequest(dockerfile="Dockerfile", context=".", platform="linux/amd64")
    with pytest.raises(TargetFailed):
        buildkit.run(request, registry_host="registry.example", creds={"username": "ci", "password": TOKEN},
                     cwd=tmp_path)
    DockerEngine(DockerAPI(docker.DockerClient(base_url="unix:///nonexistent.sock", version="1.45"))).prune_build_cache("abc")
    records = recorders.records("docker")
    assert {r.argv[1] for r in records} >= {"version", "inspect", "build", "prune"}
    assert any(r.argv[0] == "context" for r in records)
    _clean(records, "DOCKER_HOST", "BUILDX_BUILDER", "LANG")
    build = next(r for r in records if "build" in r.argv)
    assert build.env["DOCKER_CONFIG"] != os.environ["DOCKER_CONFIG"]  # the build's own, with the login
    assert build.env["BUILDX_GIT_INFO"] == "0"  # no git commands for provenance the build does not make
    assert not any("PIP_DEFAULT_TIMEOUT" in r.env for r in records)


def test_podman_gets_its_configuration_and_no_secret(recorders, tmp_path, monkeypatch):
    """``podman system service`` (a daemon for the run), the podman CLI and ``podman build``."""
    from builder.oci import buildah
    from builder.oci import podman as engine
    from builder.oci.docker import DockerAPI

    recorders.add("podman")
    monkeypatch.setattr(engine, "podman_socket", lambda: None)
    with pytest.raises(OSError, match="podman system service"):
        engine.PodmanEngine.from_env()
    found = engine.PodmanEngine(DockerAPI(docker.DockerClient(base_url="unix:///nonexistent.sock", version="1.45")),
                               "unix:///nonexistent.sock")
    with pytest.raises(engine.EngineError):
        found._cli(["version"], "podman version")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    request = BuildRequest(dockerfile="Dockerfile", context=".", platform="linux/amd64")
    with pytest.raises(TargetFailed):
        buildah.run(request, per_run_network=True, cwd=tmp_path)
    records = recorders.records("podman")
    assert [r.argv[:2] for r in records] == [["system", "service"], ["version"], ["build", "--file"]]
    _clean(records, "CONTAINERS_CONF", "LANG")
    assert not any("DOCKER_HOST" in r.env for r in records)


def test_zstd_gets_no_setting_that_changes_the_bytes(recorders):
    """ZSTD_NBTHREADS would make zstd write multi-threaded frames: other bytes, another layer digest."""
    from builder.oci import recompress

    recorders.add("zstd", recorders.real("zstd"))
    data = b"a layer " * 1000
    assert gzip.decompress(recompress._compressed(gzip.compress(data), "gzip")) == data
    recompress._compressed(data, "zstd")
    _clean(recorders.records("zstd"), "LANG")
    assert not any("ZSTD_NBTHREADS" in r.env for r in recorders.records("zstd"))


def test_enroot_gets_no_secret(recorders):
    from builder.host import doctor

    recorders.add("enroot", "echo 4.1.2")
    assert doctor._enroot_version() == (4, 1)
    _clean(recorders.records("enroot"), "LANG")


def test_sbatch_passes_the_users_environment_to_the_job_but_not_the_builders_secrets(recorders, tmp_path):
    """The job inherits the submitting environment (Slurm's ``--export=ALL``), which the user's command
    may read; the registry login and signing key are the builder's, not the job's."""
    from builder.cluster import slurm

    recorders.add("sbatch", "exit 0")
    assert slurm.submit(tmp_path / "job.sbatch") == 0
    _clean(recorders.records("sbatch"), "LANG", "DOCKER_HOST", allowed=tuple(CLOUD))


def test_cosign_gets_its_key_alone(recorders):
    """cosign gets the key it signs with (as its extra) and nothing else of the planted secrets."""
    from builder.supply import cosign

    recorders.add("cosign", "exit 0")
    cosign._run(["version"], {cosign.KEY_ENV: "the-key", cosign.COSIGN_PASSWORD_ENV: "its-password"})
    (record,) = recorders.records("cosign")
    assert record.env[cosign.KEY_ENV] == "the-key" and record.env[cosign.COSIGN_PASSWORD_ENV] == "its-password"
    _clean([record], "LANG")


def test_a_credential_helper_gets_its_environment_where_one_is_named(recorders, tmp_path):
    """With ``credsStore`` in the Docker config, the helper docker-py runs gets no builder secret (their
    values blanked: docker-py starts it from the whole environment), and docker and cosign get what a
    helper reads (here AWS_*, as ecr-login): that secret is theirs to use then."""
    import json

    from builder.oci import registry
    from builder.supply import cosign

    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text(json.dumps({"credsStore": "planted"}))
    recorders.add("docker-credential-planted", 'echo \'{"Username": "u", "Secret": "s"}\'')
    assert registry.credentials("registry.example") == {"username": "u", "password": "s"}
    _clean(recorders.records("docker-credential-planted"), "LANG", allowed=tuple(CLOUD))
    recorders.add("cosign", "exit 0")
    cosign._run(["version"], {})
    _clean(recorders.records("cosign"), "AWS_SECRET_ACCESS_KEY", allowed=("AWS_SECRET_ACCESS_KEY",))
    assert "GITHUB_TOKEN" not in recorders.records("cosign")[0].env


@pytest.mark.parametrize("allowed", [secrets.ENGINE, secrets.PODMAN, secrets.COSIGN, secrets.PIP, secrets.UV,
                                     secrets.GIT, secrets.MMDEBSTRAP, secrets.HADOLINT, secrets.PLAIN,
                                     secrets.ALL])
def test_no_allow_list_lets_a_builder_secret_through(allowed, monkeypatch):
    for name, value in OWN.items():
        monkeypatch.setenv(name, value)
    assert not set(secrets.child_env(allowed)) & secrets.SECRET_ENV
