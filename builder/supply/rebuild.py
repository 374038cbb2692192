"""``builder verify --rebuild REF``: build a published image again from its signed provenance and
compare the two, layer by layer.

What a consumer runs to trust an image without trusting the machine that built it. The
provenance (its signature checked first, :func:`builder.supply.verify.signed_provenance`) names
the commit, the target and platform, the base by digest and the SHA-256 of each lock and of the
Dockerfile. The commit is checked out into a temporary clone of the source checkout (or the
checkout itself is used when its HEAD is that commit: then its uncommitted changes are in the
rebuild, and a line says so); the recorded files are checked against their digests; that
checkout's own builder then builds the platform's image without the layer cache and without
smoke-testing it (``builder build --rebuild --no-smoke``), on this machine's engine.

The rebuild is the same image when its ID (the manifest digest on the containerd store, the
config digest on the classic store and podman) is the published image's. An image published with
BuildKit's inline cache record (pushed from the classic store, :func:`builder.images.plan.cache_exports`,
or by an older builder) can't be that: the record holds the layers' wall-clock
creation times, and the rebuild writes none. It passes when every layer's content and the
configuration but that record are the same, and the PASS line says so. Otherwise each layer
whose content (diff ID) differs gets one line with both sizes and the first path that differs
(:mod:`builder.supply.layerdiff`), and the image configuration its first differing field.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.config.errors import UserError
from builder.config.platforms import host_platform
from builder.oci import artifacts, registry
from builder.oci.engine import Engine
from builder.oci.secrets import GIT, child_env
from builder.supply import layerdiff

INDEX_TYPES = (artifacts.OCI_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json")


@dataclass(frozen=True)
class Recorded:
    """What the provenance says the image was made from."""

    target: str
    platform: str
    commit: str
    dirty: bool
    #: file (relative to the project root) -> its SHA-256: the locks and the Dockerfile
    files: dict[str, str]

    @classmethod
    def of(cls, statement: dict[str, Any]) -> Recorded:
        definition = (statement.get("predicate") or {}).get("buildDefinition") or {}
        params = definition.get("externalParameters") or {}
        deps = definition.get("resolvedDependencies") or []
        source: dict[str, Any] = next((d for d in deps if d.get("name") == "source"), {})
        commit = (source.get("digest") or {}).get("gitCommit", "")
        if not params.get("target") or not params.get("platform") or len(commit) != 40:
            raise UserError("the provenance names no target, platform or commit: it was not made by builder build "
                            "--push with a signing key, and cannot be rebuilt from")
        files = {d["name"]: d["digest"]["sha256"] for d in deps
                 if str(d.get("uri", "")).startswith("file:") and "sha256" in (d.get("digest") or {})}
        return cls(params["target"], params["platform"], commit, bool((source.get("annotations") or {}).get("dirty")),
                   files)


@dataclass(frozen=True)
class Published:
    """The published image as the registry holds it."""

    subject: str
    platform: str
    digest: str
    config_digest: str
    config: dict[str, Any]
    #: (blob digest, compressed size) per layer, base first
    layers: tuple[tuple[str, int], ...]

    @property
    def diff_ids(self) -> tuple[str, ...]:
        return tuple((self.config.get("rootfs") or {}).get("diff_ids") or ())


def published(ref: str, platform: str | None, creds: dict[str, str] | None) -> Published:
    """The image *ref* names (for an index: its *platform* image, this host's by default)."""
    r = registry.Ref.parse(ref)
    found = artifacts.get_manifest(ref, creds)
    if found is None:
        raise UserError(f"registry {r.host} has no {ref}")
    media, body, digest = found
    doc = json.loads(body)
    if media in INDEX_TYPES:
        want = platform or host_platform()
        entry = next((m for m in doc.get("manifests", [])
                      if f"{(m.get('platform') or {}).get('os')}/{(m.get('platform') or {}).get('architecture')}"
                      == want), None)
        if entry is None:
            raise UserError(f"{ref} holds no {want} image: pass --platform with one it holds")
        return published(f"{r.name}@{entry['digest']}", want, creds)
    config = artifacts.get_blob(r.name, doc["config"]["digest"], creds)
    if config is None:
        raise UserError(f"registry {r.host} has no configuration blob for {ref}")
    cfg = json.loads(config)
    plat = f"{cfg.get('os')}/{cfg.get('architecture')}"
    if platform and platform != plat:
        raise UserError(f"{ref} is a {plat} image, not {platform}")
    return Published(f"{r.name}@{digest}", plat, digest, doc["config"]["digest"], cfg,
                     tuple((layer["digest"], int(layer.get("size", 0))) for layer in doc.get("layers", [])))


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False,
                          env=child_env(GIT))


@contextlib.contextmanager
def source(root: Path, commit: str, say: Callable[[str], None]) -> Iterator[Path]:
    """A folder holding *commit* of the git checkout *root*: *root* itself when its HEAD is that
    commit, else a temporary clone (its objects shared with *root*'s), removed afterwards."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise UserError(f"{root} is not a git checkout: run builder verify --rebuild in a clone of the image's "
                        "source (or pass --source)")
    root = Path(top.stdout.strip())
    if _git(root, "rev-parse", "HEAD").stdout.strip() == commit:
        changed = _git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip()
        say(f"rebuilding from this checkout ({root}), at {commit[:12]}"
            + (": its uncommitted changes are in the rebuild" if changed else ""))
        yield root
        return
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise UserError(f"commit {commit[:12]} is not in {root}: git fetch the branch the image was built from, "
                        "then run this again")
    folder = Path(tempfile.mkdtemp(prefix="builder-rebuild-"))
    try:
        for args in (("clone", "--quiet", "--shared", "--no-checkout", str(root), str(folder)),
                     ("-C", str(folder), "checkout", "--quiet", "--detach", commit)):
            done = subprocess.run(["git", *args], capture_output=True, text=True, check=False, env=child_env(GIT))
            if done.returncode != 0:
                raise UserError(f"checking out {commit[:12]} into {folder} failed: {done.stderr.strip()[:300]}")
        say(f"rebuilding from {commit[:12]}, checked out into {folder}")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check_inputs(folder: Path, recorded: Recorded) -> None:
    """The locks and Dockerfile the provenance names hold, at *folder*, the digests it records."""
    import hashlib

    for rel, want in sorted(recorded.files.items()):
        path = folder / rel
        got = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        if got != want:
            found = f"sha256 {got[:12]}" if got else "no such file"
            raise UserError(f"{rel} at {recorded.commit[:12]}: {found}, the provenance records sha256 {want[:12]}: "
                            "this checkout is not the image's source")


def rebuild(folder: Path, recorded: Recorded, engine_choice: str | None) -> str:
    """Build the recorded target and platform in *folder* with that checkout's own builder, without the
    layer cache or a smoke test; the image's ID."""
    argv = [sys.executable, "-m", "builder", "build", "-t", recorded.target, "--platform", recorded.platform,
            "--rebuild", "--no-smoke", "--json", "-q", *(["--engine", engine_choice] if engine_choice else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}
    # the builder itself: it reads the engine, registry and index settings the user gave this run
    done = subprocess.run(argv, cwd=folder, stdout=subprocess.PIPE, text=True, check=False, env=env)
    try:
        outcome = json.loads(done.stdout)[0]
    except (ValueError, IndexError, KeyError):
        outcome = {}
    if done.returncode != 0 or not outcome.get("image_id"):
        raise UserError(f"the rebuild of {recorded.target} ({recorded.platform}) failed: "
                        f"{outcome.get('error') or 'see the lines above'}")
    return str(outcome["image_id"])


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return ""


#: Configuration keys that are no part of the image's content: the layers' list (compared layer by layer)
#: and BuildKit's inline cache record, which some published images carry and a rebuild never writes
#: (:func:`builder.images.plan.cache_exports`).
NOT_CONTENT = ("rootfs", "moby.buildkit.cache.v0")


def _first_field(a: Any, b: Any, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in NOT_CONTENT and (found := _first_field(a.get(key), b.get(key), f"{path}.{key}".lstrip("."))):
                return found
        return None
    return None if a == b else f"{path}: {json.dumps(a)} published, {json.dumps(b)} rebuilt"


def compare(engine: Engine, image_id: str, pub: Published, creds: dict[str, str] | None) -> list[str]:
    """One line per difference between the rebuilt image *image_id* and *pub*; none when they are the same image."""
    if image_id in (pub.digest, pub.config_digest):
        return []
    facts = engine.image(image_id)
    rebuilt_ids = facts.layers if facts else ()
    with tempfile.TemporaryDirectory(prefix="builder-verify-") as tmp:
        archive = Path(tmp) / "rebuilt.tar"
        with archive.open("wb") as out:
            for chunk in engine.save(image_id):
                out.write(chunk)
        with tarfile.open(archive) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))[0]  # type: ignore[arg-type]
            config = json.load(tar.extractfile(manifest["Config"]))  # type: ignore[arg-type]
            lines = []
            count = max(len(pub.diff_ids), len(rebuilt_ids))
            for i in range(count):
                ours = pub.diff_ids[i] if i < len(pub.diff_ids) else None
                theirs = rebuilt_ids[i] if i < len(rebuilt_ids) else None
                if ours == theirs:
                    continue
                lines.append(_layer_line(i, count, pub, ours, theirs, tar, manifest["Layers"], creds, Path(tmp)))
    if (field := _first_field(pub.config, config)) is not None:
        lines.append(f"config: {field}")
    return lines


def _layer_line(i: int, count: int, pub: Published, ours: str | None, theirs: str | None, tar: tarfile.TarFile,
                members: list[str], creds: dict[str, str] | None, tmp: Path) -> str:
    head = f"layer {i + 1}/{count}"
    if ours is None or theirs is None:
        return f"{head}: only in the {'rebuilt' if ours is None else 'published'} image"
    blob_digest, size = pub.layers[i]
    blob = artifacts.get_blob(registry.Ref.parse(pub.subject).name, blob_digest, creds)
    member = tar.getmember(members[i])
    # The published size is the registry's compressed blob, the rebuilt one the saved tar's member.
    sizes = (f"published {ours[7:19]} ({_size(size)} in the registry), "
             f"rebuilt {theirs[7:19]} ({_size(member.size)} uncompressed)")
    if blob is None:
        return f"{head}: {sizes}; the registry no longer has the published layer"
    (tmp / "published").write_bytes(blob)
    with tar.extractfile(member) as src, (tmp / "rebuilt").open("wb") as dst:  # type: ignore[union-attr]
        shutil.copyfileobj(src, dst)
    found = layerdiff.first_difference(layerdiff.entries(tmp / "published"), layerdiff.entries(tmp / "rebuilt"))
    where = f"first difference: {found[0]} ({found[1]})" if found else "the same files (the tar streams differ)"
    return f"{head}: {sizes}; {where}"
