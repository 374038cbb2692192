"""The base's bytes between the engine and the registry: pushed from its own bytes, copied between
registries, saved from the engine, loaded into it.

The base is pushed from its own bytes (:func:`push_base`), not by the engine: the engine
compresses a layer as its content store happens to hold it (uncompressed as loaded, or a gzip or
zstd copy of the same layer that an earlier build or pull left), so the same content got other
manifest digests. Our layer blob is the tarball gzipped by zlib at a fixed level with a fixed
header, so the same content always gives the same pin.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import tarfile
import zlib
from pathlib import Path

from builder.base.bootstrap import Rootfs, bootstrap, image_config, write_archive
from builder.config import platforms, tags
from builder.config.errors import UserError
from builder.config.project import Project
from builder.oci.artifacts import OCI_MANIFEST, get_blob, get_manifest, push_blob, put_manifest
from builder.oci.engine import Engine, EngineError
from builder.oci.registry import credentials


def base_tag(project: Project, platform: str) -> str:
    """The tag a platform's base is pushed under before it is pinned by digest: ``base:<suite>-<arch>``."""
    return tags.base_tag(project.matrix.registry, project.matrix.base.debian_suite, platforms.arch(platform))


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
    digest = put_manifest(repository, tags.tag_of(tag), base_manifest(layer, config), OCI_MANIFEST, creds)
    hold(engine, f"{repository}@{digest}", platform)
    return digest


def hold(engine: Engine, reference: str, platform: str) -> None:
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
