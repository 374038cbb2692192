"""Helpers only the tests use (import as `from helpers import ...`).

What the tests share with the benchmark (project copies, ports, matrix edits, registries, the
rule for a missing prerequisite) lives in ``devtools/support.py``: import it from there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from devtools.support import REPO, base_pin, copy_project, edit_matrix, host_platform, retarget_base_lock

if TYPE_CHECKING:
    from builder.config.project import Project, TargetView


def run_builder(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 1800):
    """Run the real CLI in a subprocess (exit codes and stderr exactly as a user sees them)."""
    return subprocess.run(
        [sys.executable, "-m", "builder", *args], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, **(env or {})}, timeout=timeout, check=False,
    )


def multiarch_project(tmp_path: Path, registry: str, name: str) -> tuple[Path, str, str, str]:
    """A project copy publishing to ``<registry>/<name>``, the repo's base pins retargeted there (a build
    with ``--update-base`` bootstraps what the registry lacks); (root, repository, this host's platform,
    the foreign one the emulated tests build under qemu)."""
    root = copy_project(tmp_path / "p")
    repo = f"{registry}/{name}"
    edit_matrix(root, registry=repo)
    retarget_base_lock(REPO, root, repo)
    host = host_platform()
    return root, repo, host, "linux/arm64" if host == "linux/amd64" else "linux/amd64"


def index_platforms(ref: str) -> dict[str, str]:
    """The OCI image index *ref* names, read back with skopeo: {"os/arch": manifest digest}."""
    proc = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
                          capture_output=True, text=True, check=True)
    index = json.loads(proc.stdout)
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json", index
    return {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in index["manifests"]}


def publish_base_to(engine: Any, src: Path, dest: Path, registry: str) -> dict[str, Any]:
    """Pin src's base in dest as ``<registry>/base@...`` and copy it there from src's registry, byte for
    byte (same digest; a push from the classic store would re-encode its manifest)."""
    from builder.base.blobs import copy_base

    source = base_pin(src)["reference"]  # the engine's own ID for it differs by image store
    lock = retarget_base_lock(src, dest, registry)
    assert copy_base(source, registry + "/base", "bookworm") == source.split("@")[1]
    return lock


def bare_build_project(monkeypatch: Any, folder: Path) -> Project:
    """Stub what ``build_all`` does before building (base, locks, render, content; wheelhouse: *folder*).

    Returns the least project ``build_all`` needs (a stand-in): its root (*folder*). Each view's content
    tag is ``127.0.0.1:1/fake:<unit>-0`` (no registry answers there: nothing is reused from one), and
    its build context ``wheels`` an empty folder of *folder*.
    """
    from builder.images import build, content, render
    from builder.wheels import layers, wheelhouse

    monkeypatch.setattr(build.base, "pin", lambda engine, project, *a, **k: project)
    monkeypatch.setattr(build.base, "get", lambda engine, project, platform, **k: "base@sha256:0")
    monkeypatch.setattr(build.locks, "lock_all", lambda *a, **k: {})
    monkeypatch.setattr(content, "content_tags",
                        lambda project, views, *a: {v.unit: f"127.0.0.1:1/fake:{v.unit}-0" for v in views})
    monkeypatch.setattr(content, "build_args", lambda project, target: {})  # no locks: no layer arguments
    monkeypatch.setattr(layers, "context_layers", lambda project, target: {})  # nor wheels
    monkeypatch.setattr(wheelhouse, "location", lambda: folder)
    monkeypatch.setattr(render, "render", lambda *a: {})
    monkeypatch.setattr(render, "write", lambda *a: None)
    return cast("Project", SimpleNamespace(root=folder, matrix=SimpleNamespace(),
                                           base_refs={host_platform(): "base@sha256:0"},
                                           base_for=lambda platform: "base@sha256:0"))


def fake_view(name: str, platform: str | None = None, **fields: Any) -> TargetView:
    """The least target view ``build_all`` needs for a test Dockerfile (a stand-in): one platform (default:
    this host's), tagged ``primary_ref`` (default: ``127.0.0.1:1/fake:<name>``, where no registry answers)."""
    platform = platform or host_platform()
    primary = fields.pop("primary_ref", f"127.0.0.1:1/fake:{name}")
    return cast("TargetView", SimpleNamespace(
        name=name, unit=name, platform=platform, platforms=[platform], local_refs=[primary], primary_ref=primary,
        refs=[primary], platform_refs=[], alias_refs=[], labels={}, arch=platform.split("/")[1], layers=["packages"],
        native=platform == host_platform(), compression="gzip", **fields))


def assert_golden(path: Path, text: str) -> None:
    """*text* equals the golden file at *path*; with UPDATE_GOLDEN=1 it is rewritten and the test skipped.

    Comparing with what was just written would pass whatever the output: compare on the next run.
    """
    import pytest

    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        pytest.skip(f"golden file {path.name} updated; review the diff and rerun without UPDATE_GOLDEN")
    assert text == path.read_text()


# --- cosign and oras, run as peers: what an admission controller or a user runs ---------------------

#: What cosign needs against a plain-HTTP loopback registry, and without the public transparency log.
COSIGN_OFFLINE = ["--insecure-ignore-tlog", "--allow-insecure-registry", "--allow-http-registry"]


def require_peers() -> None:
    """cosign and oras must be installed: fail under CI, skip elsewhere."""
    import shutil

    from devtools.support import fail_or_skip

    for tool in ("cosign", "oras"):
        if shutil.which(tool) is None:
            fail_or_skip(f"{tool} is not installed (apt-get install {tool}; scripts/setup-host.sh installs it)")


def cosign(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["cosign", *args], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **(env or {})})


def cosign_verify(ref: str, key: Path, kind: str) -> subprocess.CompletedProcess[str]:
    """cosign's own check of *kind* (sig: cosign verify; sbom, att: verify-attestation --type)."""
    if kind == "sig":
        return cosign("verify", "--key", str(key), *COSIGN_OFFLINE, ref)
    return cosign("verify-attestation", "--key", str(key), "--type", {"sbom": "cyclonedx", "att": "slsaprovenance1"}[kind],
                  *COSIGN_OFFLINE, ref)


def cosign_passes(ref: str, key: Path) -> list[bool]:
    """[sig, sbom, att]: whether cosign accepts each for *ref*."""
    return [cosign_verify(ref, key, kind).returncode == 0 for kind in ("sig", "sbom", "att")]


def discover(ref: str) -> list[dict[str, Any]]:
    """oras discover's referrers of *ref* (it reads the referrers API, else the referrers tag)."""
    import json

    run = subprocess.run(["oras", "discover", "--plain-http", "--format", "json", ref], capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    found: list[dict[str, Any]] = json.loads(run.stdout).get("manifests") or []
    return found


def delete_manifest(ref: str) -> None:
    """oras deletes the manifest *ref* names (the registry must allow deletes): an attachment removed."""
    run = subprocess.run(["oras", "manifest", "delete", "--plain-http", "--force", ref], capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr


def load_one_file_image(engine: Any, folder: Path, arch: str, ref: str, labels: dict[str, str] | None = None) -> str:
    """Load an image of one file (/arch.txt) whose config says *arch* (and has *labels*); return its ID.

    Written as a docker-archive the way ``builder base`` writes the base: a stand-in for a foreign
    platform's image where this host can't build one (no emulation in the test's budget).
    """
    import hashlib
    import io
    import json
    import tarfile

    from builder.base.bootstrap import Rootfs, write_archive

    folder.mkdir()
    layer = folder / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        data = f"{arch}\n".encode()
        info = tarfile.TarInfo("arch.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    diff_id = "sha256:" + hashlib.sha256(layer.read_bytes()).hexdigest()
    # A history entry per layer, as every builder writes: without one docker-registry 2.8 answers 400 to a
    # HEAD that accepts no schema 2 manifest (dockerd's, before a push over the tag), failing to make schema 1.
    config = json.dumps({"architecture": arch, "os": "linux", "config": {"Cmd": ["/arch.txt"], "Labels": labels or {}},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                         "history": [{"created_by": "one file"}]}, sort_keys=True).encode()
    image_id = write_archive(Rootfs(layer, diff_id, {}), config, ref, folder / "image.tar")
    with (folder / "image.tar").open("rb") as handle:
        engine.client.api.load_image(handle)
    return image_id


def fetch_wheels(files: Mapping[str, bytes | Path], clone: str | None = None, house: Path | None = None,
                 link: bool = False) -> None:
    """Bring *files* (bytes, or a file to copy, or with *link* to hard-link) into the wheelhouse (*house*,
    else ``BUILDER_WHEELHOUSE``) as an earlier run's fetch did: downloaded into a folder of their own, then
    adopted, which records each as the builder's (used by *clone*)."""
    import shutil
    import tempfile
    from unittest import mock

    from builder.wheels import wheelhouse

    target = house or Path(os.environ.get("BUILDER_WHEELHOUSE") or tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix=".fetched-", dir=target if link else None) as downloads, \
            mock.patch.dict(os.environ, {"BUILDER_WHEELHOUSE": str(house)} if house else {}):
        for name, data in files.items():
            if isinstance(data, Path) and link:
                os.link(data, Path(downloads) / name)
            elif isinstance(data, Path):
                shutil.copyfile(data, Path(downloads) / name)
            else:
                (Path(downloads) / name).write_bytes(data)
        if clone is None:
            wheelhouse.adopt(Path(downloads))
        else:
            wheelhouse.adopt(Path(downloads), clone)
        if hasattr(wheelhouse, "release"):
            wheelhouse.release()  # a fetch of a run that has ended: it holds them no more


class _DockerAt:
    """The two facts the builder keys its ledgers of a Docker engine on (builder/gc/owned.py's engine_key)."""

    def __init__(self, host: str) -> None:
        self.host = host

    def name(self) -> str:
        return "docker"

    def store_key(self) -> str:
        return self.host  # DockerEngine's: its address


def forget_engines(hosts: Iterable[str]) -> None:
    """Remove the builder's ledgers (images, build cache) of the Docker engines at *hosts*, which a test
    started and removed (devtools/dockerd.py): what they name went with the engine."""
    from builder.gc import owned
    from builder.oci.engine import Engine

    for host in hosts:
        engine = cast(Engine, _DockerAt(host))
        owned.images_ledger(engine).discard()
        owned.build_cache_ledger(engine).discard()


def remove_clone_images(engine: Any, root: Path) -> list[str]:
    """Remove the images the builder recorded for the clone *root* alone that no tag keeps, and their
    records; their IDs. A test's build that a later one of the same test superseded (or whose tags
    the test removed) stays as a dangling image on the containerd store, ~0.3 GB of its own each,
    until ``builder gc`` finds that clone unused for a day."""
    from builder.config.ownership import clone_id
    from builder.gc import owned

    ledger = owned.images_ledger(engine)
    gone = []
    for image_id in ledger.select(lambda _, record: set(record.clones) == {clone_id(root)}):
        facts = engine.image(image_id)
        if facts is None or (not facts.tags and engine.remove_image(image_id) is None):
            gone.append(image_id)
    ledger.forget(gone)
    return gone


def registry_folders() -> set[Path]:
    """The builder's registry folders in the user's state (builder/oci/loopback.py), one per loopback port."""
    from builder.config.state import state_dir

    return set(state_dir().glob("registry-*"))


def remove_lock_only_folders(before: set[Path]) -> list[Path]:
    """Remove the registry folders made since *before* that hold nothing but their lock, which no process
    holds: the builder made them for a test's own registry and started none there. Returns them."""
    import fcntl
    import shutil

    removed = []
    for folder in sorted(registry_folders() - before):
        if [p.name for p in folder.iterdir()] != [".lock"]:
            continue
        with open(folder / ".lock", "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a run holds it: its folder, in use
                continue
            shutil.rmtree(folder)
            removed.append(folder)
    return removed
