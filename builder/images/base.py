"""``builder base``: make, push and pin the shared base every target starts from.

With ``bootstrap:``, mmdebstrap writes a root file system tarball; with a fixed
SOURCE_DATE_EPOCH the same packages give the same bytes. We then write the docker-archive
ourselves, with a config whose ``created`` time is that epoch, so the image ID (the config's
digest) is reproducible too (``docker import`` would stamp the current time). With
``image:``, the pinned reference is pulled. The registry digest goes into base.lock.json.

The base is pushed from its own bytes (:func:`push_base`), not by the engine: the engine
compresses a layer as its content store happens to hold it (uncompressed as loaded, or a gzip or
zstd copy of the same layer that an earlier build or pull left), so the same content got other
manifest digests. Our layer blob is the tarball gzipped by zlib at a fixed level with a fixed
header, so the same content always gives the same pin.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.parse
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from builder.config import platforms
from builder.config.baselock import BaseLock, PinnedBase, read_base_lock, write_base_lock
from builder.config.errors import UserError
from builder.config.matrix import Bootstrap
from builder.config.project import Project, pinned_base_refs, spec_hash
from builder.config.urls import public
from builder.images.progress import HEARTBEAT_S, heartbeat
from builder.oci.artifacts import OCI_MANIFEST, get_blob, get_manifest, push_blob, put_manifest
from builder.oci.engine import Engine, EngineError
from builder.oci.localregistry import ensure_local
from builder.oci.registry import RegistryFault, credentials, manifest_digest
from builder.oci.registry import ping as registry_answers
from builder.oci.secrets import MMDEBSTRAP, child_env


@dataclass(frozen=True)
class Rootfs:
    """A bootstrapped root file system tarball and what is inside."""

    tarball: Path
    diff_id: str
    packages: dict[str, str]


#: Where apt inside the bootstrap reads the mirror's login (apt_auth.conf(5)): put there by a setup hook
#: from the builder's private folder, removed by a customize hook before the root file system is packed.
AUTH_IN_ROOT = "etc/apt/auth.conf.d/90-builder-mirror.conf"


def mirror_login(mirror: str) -> str | None:
    """apt_auth.conf(5)'s entry for the login in *mirror* (``http://user:password@host/debian``); None without one.

    The mirror goes to mmdebstrap, and so into the base's apt sources, without it (:func:`public`).

    Example:
        >>> mirror_login("http://ci:t%40k@mirror.example:8080/debian")
        'machine http://mirror.example:8080/debian login ci password t@k\\n'
        >>> mirror_login("http://deb.debian.org/debian") is None
        True
    """
    parts = urllib.parse.urlsplit(mirror)
    if parts.username is None:
        return None
    login, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
    if any(c.isspace() for c in login + password):
        raise UserError(f"base.bootstrap.mirror {public(mirror)}: its login holds white space, which apt's auth.conf "
                        "cannot carry; use a login without it")
    netloc = parts.netloc.rpartition("@")[2]
    return f"machine {parts.scheme}://{netloc}{parts.path} login {login} password {password}\n"


def mmdebstrap_argv(spec: Bootstrap, output: Path, platform: str, auth: Path | None = None) -> list[str]:
    """The mmdebstrap command for a spec and platform (docs and man pages left out, copyright files kept).

    A foreign architecture's maintainer scripts run under qemu (binfmt_misc), as in its containers.
    The mirror is named without its login; *auth*, the file holding it (:func:`mirror_login`), is
    apt's for the bootstrap alone.

    Example:
        >>> spec = project.matrix.base.bootstrap
        >>> mmdebstrap_argv(spec, Path("/tmp/rootfs.tar"), "linux/arm64")[:4]
        ['mmdebstrap', '--variant=minbase', '--arch=arm64', '--format=tar']
    """
    put = f'mkdir -p "$1/etc/apt/auth.conf.d" && install -m 0600 {shlex.quote(str(auth))} "$1/{AUTH_IN_ROOT}"'
    hooks = [f"--setup-hook={put}", f'--customize-hook=rm "$1/{AUTH_IN_ROOT}"'] if auth else []
    return [
        "mmdebstrap",
        f"--variant={spec.variant}",
        f"--arch={platforms.arch(platform)}",
        "--format=tar",
        f"--include={','.join(spec.packages)}",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        "--verbose",  # dpkg's lines: the heartbeat counts the packages
        *hooks,
        spec.suite,
        str(output),
        public(spec.mirror),
    ]


def bootstrap(spec: Bootstrap, workdir: Path, platform: str) -> Rootfs:
    """Run mmdebstrap into *workdir*; return the tarball, its digest and its package list."""
    if shutil.which("mmdebstrap") is None:
        raise UserError("mmdebstrap is not installed: apt-get install mmdebstrap (it makes the base)")
    if (problem := platforms.emulation_problem(platform)) is not None:
        raise UserError(f"bootstrapping the base: {problem}")
    output = workdir / "rootfs.tar"
    env = child_env(MMDEBSTRAP, {"SOURCE_DATE_EPOCH": str(spec.source_date_epoch)})
    auth = None
    if (login := mirror_login(spec.mirror)) is not None:
        auth = workdir / "mirror-auth.conf"
        auth.touch(mode=0o600)
        auth.write_text(login)
    try:
        code, stderr = _run_mmdebstrap(mmdebstrap_argv(spec, output, platform, auth), env, platform)
    finally:
        if auth is not None:
            auth.unlink()
    if code != 0:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        raise UserError(f"mmdebstrap failed for suite {spec.suite} ({platform}) from {public(spec.mirror)}: {tail}")
    digest = hashlib.sha256()
    with output.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return Rootfs(output, f"sha256:{digest.hexdigest()}", _packages(output))


def _run_mmdebstrap(argv: list[str], env: dict[str, str], platform: str,
                    heartbeat_s: float = HEARTBEAT_S) -> tuple[int, str]:
    """Run mmdebstrap, saying what it does every *heartbeat_s* seconds (minutes under qemu, silent
    otherwise); return its exit code and output. ``--verbose`` prints dpkg's lines, which count the packages."""
    started, lines, unpacked = time.monotonic(), [], [0]
    stage = ["starting"]

    def status() -> str:
        return (f"bootstrapping {platform}: {unpacked[0]} packages unpacked, {stage[0]} "
                f"({time.monotonic() - started:.0f} s)")

    with heartbeat(status, heartbeat_s), subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                                         stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Unpacking "):
                unpacked[0] += 1
            elif line.startswith("I: "):
                stage[0] = line[3:].strip().rstrip(".")
        code = proc.wait()
    return code, "".join(lines)


def _packages(tarball: Path) -> dict[str, str]:
    """Installed Debian packages and versions, read from the tarball's dpkg status."""
    with tarfile.open(tarball) as tar:
        member = tar.extractfile("./var/lib/dpkg/status")
        text = member.read().decode() if member else ""
    out = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if "Package" in fields and "installed" in fields.get("Status", ""):
            out[fields["Package"]] = fields.get("Version", "")
    return dict(sorted(out.items()))


def image_config(rootfs: Rootfs, spec: Bootstrap, platform: str) -> bytes:
    """The image config, serialised deterministically; its sha256 is the image ID."""
    created = datetime.fromtimestamp(spec.source_date_epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = {
        "architecture": platforms.arch(platform),
        "os": "linux",
        "created": created,
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
            "Cmd": ["/bin/bash"],
            "Labels": {"io.ml-image-builder.images.base": f"debian-{spec.suite}-{spec.variant}"},
        },
        "rootfs": {"type": "layers", "diff_ids": [rootfs.diff_id]},
        "history": [{"created": created, "created_by": f"mmdebstrap {spec.suite} ({', '.join(spec.packages)})"}],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def write_archive(rootfs: Rootfs, config: bytes, repo_tag: str, archive: Path) -> str:
    """Write a docker-archive (``docker save`` layout) and return the image ID it loads as."""
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    layer_dir = rootfs.diff_id.split(":", 1)[1]
    manifest = json.dumps([{"Config": f"{image_id[7:]}.json", "RepoTags": [repo_tag],
                            "Layers": [f"{layer_dir}/layer.tar"]}]).encode()
    with tarfile.open(archive, "w") as tar:
        for name, data in ((f"{image_id[7:]}.json", config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
        tar.add(rootfs.tarball, arcname=f"{layer_dir}/layer.tar")
    return image_id


def base_tag(project: Project, platform: str) -> str:
    """The tag a platform's base is pushed under before it is pinned by digest: ``base:<suite>-<arch>``."""
    return f"{project.base_repository}:{project.matrix.base.debian_suite}-{platforms.arch(platform)}"


#: The media types of the base's own manifest (OCI: every engine this project supports pulls it).
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


def gzip_layer(tarball: Path) -> bytes:
    """*tarball* as a gzip blob that depends on its bytes alone: zlib at level 6, the gzip header's
    time 0 (Python's zlib, the same on every host with the same zlib).

    Example:
        >>> blob = gzip_layer(Path("matrix.yaml"))
        >>> blob == gzip_layer(Path("matrix.yaml")), blob[:10].hex()  # magic, deflate, no flags, time 0, Unix
        (True, '1f8b0800000000000003')
    """
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer
    out = []
    with tarball.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            out.append(compressor.compress(chunk))
    return b"".join([*out, compressor.flush()])


def base_manifest(layer: bytes, config: bytes) -> bytes:
    """The base's OCI image manifest, serialised canonically: the same blobs give the same digest."""
    def descriptor(media: str, blob: bytes) -> dict[str, object]:
        return {"mediaType": media, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}

    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": descriptor(OCI_CONFIG, config),
                "layers": [descriptor(OCI_LAYER_GZIP, layer)]}
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def push_base(engine: Engine, project: Project, platform: str, layer: bytes, config: bytes) -> str:
    """Push the base from its own bytes (the :func:`gzip_layer` blob, the config, :func:`base_manifest`)
    under its tag, then pull it by digest, so the engine holds what is pinned; return the manifest digest."""
    repository = project.base_repository
    creds = credentials(repository.split("/", 1)[0])
    push_blob(repository, layer, creds)
    push_blob(repository, config, creds)
    tag = base_tag(project, platform)
    digest = put_manifest(repository, tag.rsplit(":", 1)[1], base_manifest(layer, config), OCI_MANIFEST, creds)
    _hold(engine, f"{repository}@{digest}", platform)
    return digest


def _hold(engine: Engine, reference: str, platform: str) -> None:
    """Pull the base just pushed as *reference*, so the engine holds it under the pinned reference."""
    try:
        engine.pull(reference, credentials(reference.split("/", 1)[0]), platform=platform)
    except EngineError as exc:
        raise UserError(f"the engine could not pull the {platform} base it was pushed as ({reference}): "
                        f"{str(exc)[:200]}") from None


def copy_base(source: str, repository: str, tag: str) -> str | None:
    """The base *source* pins, copied from its registry into *repository* under *tag* byte for byte
    (the same digest, nothing through the engine); None when that registry lacks it or is unreachable."""
    old_host = source.split("/", 1)[0]
    creds, new_creds = credentials(old_host), credentials(repository.split("/", 1)[0])
    try:
        found = get_manifest(source, creds)
        if found is None:
            return None
        media, body, _digest = found
        manifest = json.loads(body)
        for descriptor in [manifest["config"], *manifest["layers"]]:
            blob = get_blob(source.split("@")[0], descriptor["digest"], creds)
            if blob is None:
                return None
            push_blob(repository, blob, new_creds)
    except UserError:  # the old registry is gone
        return None
    return put_manifest(repository, tag, body, media, new_creds)


def saved_blobs(engine: Engine, ref: str, workdir: Path) -> tuple[bytes, bytes]:
    """(:func:`gzip_layer` blob, config) of the local one-layer image *ref*, read from ``docker save``
    (its layer plain or gzipped, as the image store keeps it)."""
    archive = workdir / "saved.tar"
    with archive.open("wb") as handle:
        for chunk in engine.save(ref):
            handle.write(chunk)
    with tarfile.open(archive) as tar:
        (entry,) = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = tar.extractfile(entry["Config"]).read()  # type: ignore[union-attr]
        (name,) = entry["Layers"]
        layer = workdir / "layer.tar"
        with tar.extractfile(name) as src, layer.open("wb") as dst:  # type: ignore[union-attr]
            head = src.read(2)
            src.seek(0)
            shutil.copyfileobj(gzip.GzipFile(fileobj=src) if head == b"\x1f\x8b" else src, dst)
    archive.unlink()
    return gzip_layer(layer), config


def make_image(engine: Engine, project: Project, workdir: Path, platform: str) -> tuple[str, Rootfs]:
    """Bootstrap and load a platform's base; return its config digest (reproducible) and the root fs.

    The engine's own ID for it differs by image store (the config digest in the classic store,
    the manifest digest in the containerd store), so the load is checked by what both report:
    the layer's diff ID, the architecture and the creation time.
    """
    spec = project.matrix.base.bootstrap
    assert spec is not None
    rootfs = bootstrap(spec, workdir, platform)
    tag = base_tag(project, platform)
    config = image_config(rootfs, spec, platform)
    image_id = write_archive(rootfs, config, tag, workdir / "image.tar")
    load_archive(engine, workdir / "image.tar", f"the {platform} base")
    loaded = engine.image(tag)
    expected = json.loads(config)
    layers, arch = (loaded.layers, loaded.architecture) if loaded is not None else (None, None)
    if layers != tuple(expected["rootfs"]["diff_ids"]) or arch != expected["architecture"]:
        raise UserError(f"the engine loaded the {platform} base with layers {list(layers or ())}"
                        f" ({arch}), expected {expected['rootfs']['diff_ids']}; report this as a bug")
    return image_id, rootfs


def load_archive(engine: Engine, archive: Path, what: str) -> None:
    """Load a docker-archive into the engine; a load it refuses is one UserError naming *what*."""
    try:
        engine.load(archive)
    except EngineError as exc:
        raise UserError(f"the engine could not load {what}: {str(exc)[:200]}") from None


def image_id_of(spec: Bootstrap, workdir: Path, platform: str) -> tuple[str, Rootfs]:
    """Bootstrap without an engine and compute the image ID it would load as."""
    rootfs = bootstrap(spec, workdir, platform)
    return "sha256:" + hashlib.sha256(image_config(rootfs, spec, platform)).hexdigest(), rootfs


def drift_report(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """Package-by-package differences between the locked base and a fresh bootstrap."""
    lines = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            lines.append(f"  {name}: {old.get(name, '(absent)')} -> {new.get(name, '(absent)')}")
    return lines


def _local_has(engine: Engine, pinned: PinnedBase) -> bool:
    """The pinned base is local under its registry reference (both image stores name it so)."""
    return pinned.reference in engine.repo_digests(pinned.reference)


def _in_registry(ref: str) -> bool:
    """The registry has *ref*; False when it has not, or does not answer (:func:`ensure_base` says why)."""
    try:
        return manifest_digest(ref, credentials(ref.split("/", 1)[0])) is not None
    except (RegistryFault, UserError):
        return False


def pin(engine: Engine, project: Project, platforms_used: list[str], *, update: bool,
        say: Callable[[str], object]) -> Project:
    """*project* with each of *platforms_used* building FROM its pinned base, settled before anything is
    planned (the base is in every content tag): base.lock.json's pin when that base can be had (local,
    or in the registry: a build pulls it); else it is bootstrapped and pushed (:func:`ensure_base`),
    re-pinned only with *update* (``--update-base``, the one place it acts) when the Debian mirror moved.

    A no-op asks the engine once per platform, and the registry only for a base not local.
    """
    refs = {}
    for platform in platforms_used:
        try:  # the pinned reference, or why there is none
            ref: str | None = pinned_base_refs(project.root, project.matrix, [platform], False,
                                               project.matrix_path.name)[platform]
        except UserError:
            if not update or project.matrix.base.image is not None:
                raise
            ref = None
        if ref is not None and (project.matrix.base.image is not None or engine.image(ref) is not None
                                or _in_registry(ref)):
            refs[platform] = ref
            continue
        refs[platform] = ensure_base(engine, project, platform, update=update, say=say).reference
    return dataclasses.replace(project, base_refs={**project.base_refs, **refs})


def ensure_base(
    engine: Engine, project: Project, platform: str, *, update: bool, say: Callable[[str], object]
) -> PinnedBase:
    """Make sure *platform*'s pinned base is local and in the registry; bootstrap it when needed."""
    matrix = project.matrix
    if matrix.base.image is not None:
        if engine.image(matrix.base.image) is None:
            say(f"pulling {matrix.base.image} ({platform})")
            engine.pull(matrix.base.image, credentials(matrix.base.image.split("/", 1)[0]), platform=platform)
        return PinnedBase(reference=matrix.base.image, image_id=engine.resolve([matrix.base.image]))
    started = ensure_local(matrix.registry.split("/", 1)[0])
    if started:
        say(started)
    lock = read_base_lock(project.root)
    if lock is not None and lock.spec_sha256 != spec_hash(matrix):
        lock = None  # made from another spec: every platform's pin is stale
    pinned = lock.platforms.get(platform) if lock is not None else None
    if lock is not None and pinned is not None:
        found = _locked(engine, project, platform, lock, pinned, say)
        if found is not None:
            return found
    return _bootstrap(engine, project, platform, lock, pinned, update=update, say=say)


def _locked(engine: Engine, project: Project, platform: str, lock: BaseLock, pinned: PinnedBase,
            say: Callable[[str], object]) -> PinnedBase | None:
    """The locked base without a bootstrap: moved to the matrix's new registry, local (pushed where
    the registry lacks it) or pulled; None when it can be had from nowhere (then it is bootstrapped)."""
    host = project.matrix.registry.split("/", 1)[0]
    if not pinned.reference.startswith(f"{project.base_repository}@"):
        moved = _move_to_registry(engine, project, platform, pinned, say)
        if moved is not None:
            write_base_lock(project.root, lock.with_platform(platform, moved))
            return moved
    if _local_has(engine, pinned):
        _push_if_missing(engine, project, platform, pinned, say)
        return pinned
    try:
        started = time.monotonic()
        with heartbeat(lambda: f"pulling the locked {platform} base ({time.monotonic() - started:.0f} s)"):
            engine.pull(pinned.reference, credentials(host), platform=platform)
        say(f"pulled the locked base {pinned.reference} ({platform})")
        return pinned
    except EngineError as exc:
        if not registry_answers(host):
            raise UserError(f"registry {host} is unreachable, so the locked {platform} base {pinned.reference} "
                            "can't be pulled; start it or fix 'registry' in matrix.yaml") from None
        say(f"the locked {platform} base is neither local nor in the registry ({exc}): bootstrapping it")
    return None


def _bootstrap(engine: Engine, project: Project, platform: str, lock: BaseLock | None,
               pinned: PinnedBase | None, *, update: bool, say: Callable[[str], object]) -> PinnedBase:
    """Bootstrap *platform*'s base, push it and pin it; a fresh bootstrap that differs from *pinned*
    (the Debian mirror moved) is re-pinned with *update* only."""
    spec = project.matrix.base.bootstrap
    assert spec is not None
    started, stage = time.monotonic(), ["writing its image and loading it into the engine"]
    with heartbeat(lambda: f"the {platform} base: {stage[0]} ({time.monotonic() - started:.0f} s)"):
        with tempfile.TemporaryDirectory(prefix="builder-base-") as tmp:
            image_id, rootfs = make_image(engine, project, Path(tmp), platform)
            stage[0] = "compressing its layer"
            layer = gzip_layer(rootfs.tarball)
        stage[0] = f"pushing it to {project.base_repository}"
        return _pin_bootstrapped(engine, project, platform, lock, pinned, image_id, rootfs, layer, update=update,
                                 say=say)


def _pin_bootstrapped(engine: Engine, project: Project, platform: str, lock: BaseLock | None,
                      pinned: PinnedBase | None, image_id: str, rootfs: Rootfs, layer: bytes, *, update: bool,
                      say: Callable[[str], object]) -> PinnedBase:
    """Push and pin a bootstrapped base (:func:`_bootstrap`'s second half)."""
    spec = project.matrix.base.bootstrap
    assert spec is not None
    if pinned is not None and image_id != pinned.image_id:
        report = drift_report(pinned.packages, rootfs.packages)
        lines = [f"base drift ({platform}): a fresh bootstrap is {image_id}, base.lock.json pins {pinned.image_id}",
                 "  (the Debian mirror moved since the lock was written)", *report]
        if not update:
            raise UserError(*lines, "run 'builder base --update' to re-pin, then 'builder render' and commit both")
        for line in lines:
            say(line)
    digest = push_base(engine, project, platform, layer, image_config(rootfs, spec, platform))
    new = PinnedBase(reference=f"{project.base_repository}@{digest}", image_id=image_id, packages=rootfs.packages)
    if new != pinned:
        current = lock or BaseLock(spec_sha256=spec_hash(project.matrix))
        write_base_lock(project.root, current.with_platform(platform, new))
        say(f"pinned the {platform} base in base.lock.json: {new.reference}")
    return new


def _move_to_registry(
    engine: Engine, project: Project, platform: str, pinned: PinnedBase, say: Callable[[str], object]
) -> PinnedBase | None:
    """The matrix's registry changed: the same base (copied from the old registry byte for byte, else
    pushed from the engine's copy) pinned in the new one; None when it can be had from neither (then it
    is bootstrapped)."""
    tag = base_tag(project, platform)
    digest = copy_base(pinned.reference, project.base_repository, tag.rsplit(":", 1)[1])
    if digest is not None:
        _hold(engine, f"{project.base_repository}@{digest}", platform)
    elif _local_has(engine, pinned):
        with tempfile.TemporaryDirectory(prefix="builder-base-") as tmp:
            digest = push_base(engine, project, platform, *saved_blobs(engine, pinned.reference, Path(tmp)))
    if digest is None:
        say(f"the locked {platform} base {pinned.reference} is neither local nor in its old registry: bootstrapping it")
        return None
    moved = PinnedBase(reference=f"{project.base_repository}@{digest}", image_id=pinned.image_id,
                       packages=pinned.packages)
    say(f"the registry changed: pinned the same {platform} base in {project.base_repository} ({digest})")
    return moved


def _push_if_missing(
    engine: Engine, project: Project, platform: str, pinned: PinnedBase, say: Callable[[str], object]
) -> None:
    if manifest_digest(pinned.reference, credentials(pinned.reference.split("/", 1)[0])) is None:
        with tempfile.TemporaryDirectory(prefix="builder-base-") as tmp:
            digest = push_base(engine, project, platform, *saved_blobs(engine, pinned.reference, Path(tmp)))
        say(f"pushed the {platform} base to {project.base_repository} ({digest})")
        if not pinned.reference.endswith(digest):
            say(f"note: the registry digest {digest} differs from the lock's {pinned.reference}")
