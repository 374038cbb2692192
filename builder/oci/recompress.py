"""A pushed manifest's layers in one compression: an engine that reuses a layer the registry holds in another
(podman before 4.7: the base's, pushed as gzip) leaves a mixed image, which enroot 4.0-4.1.2 (the first layer's
type applies to all) and every puller before Docker 23 (a zstd layer) cannot take. :func:`recompress` rewrites
those layers in the registry, beside the other registry artifacts (:mod:`builder.oci.artifacts`).
"""

from __future__ import annotations

import gzip
import json
import subprocess

from builder.oci import artifacts, registry
from builder.oci.engine import PushFailed
from builder.oci.secrets import PLAIN, child_env

#: A layer's media type by (the manifest's kind, its compression).
_LAYER_TYPES = {("oci", "zstd"): "application/vnd.oci.image.layer.v1.tar+zstd",
                ("oci", "gzip"): "application/vnd.oci.image.layer.v1.tar+gzip",
                ("docker", "gzip"): "application/vnd.docker.image.rootfs.diff.tar.gzip"}


def _compressed(data: bytes, compression: str) -> bytes:
    """The layer *data* (gzip, zstd or plain tar) in *compression*; gzip as the base's is (level 6, no time)."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    elif data[:4] == b"\x28\xb5\x2f\xfd":
        data = subprocess.run(["zstd", "-q", "-d", "-c"], input=data, capture_output=True, check=True,
                              env=child_env(PLAIN)).stdout
    if compression == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    # one thread: zstd's multi-threaded frames differ from its single-threaded ones, and a digest must not
    # depend on the cores of the machine that pushed
    return subprocess.run(["zstd", "-q", "-3", "-c"], input=data, capture_output=True, check=True,
                          env=child_env(PLAIN)).stdout


def recompress(ref: str, compression: str, creds: dict[str, str] | None) -> str | None:
    """Every layer of the manifest *ref* in *compression*: the layers that are not are recompressed (the
    uncompressed bytes, so the config's diff IDs, stay), uploaded, and the manifest put under the same tag;
    return its new digest, or None when every layer was in *compression* already.

    Example:
        >>> recompress("localhost:5000/ml-runtime:cpu", "zstd", None)  # doctest: +SKIP
        'sha256:...'
    """
    found = artifacts.get_manifest(ref, creds)
    if found is None:
        return None
    media, body, _ = found
    doc = json.loads(body)
    kind = "oci" if "oci" in media else "docker"
    want = _LAYER_TYPES.get((kind, compression))
    if want is None:
        raise PushFailed(f"push of {ref}: a {kind} manifest cannot carry {compression} layers")
    r = registry.Ref.parse(ref)
    changed = False
    for layer in doc.get("layers", []):
        if layer.get("mediaType") == want:
            continue
        data = artifacts.get_blob(r.name, layer["digest"], creds)
        if data is None:
            raise PushFailed(f"push of {ref}: the registry lost layer {layer['digest']} just pushed")
        blob = _compressed(data, compression)
        layer.update(mediaType=want, digest=artifacts.push_blob(r.name, blob, creds), size=len(blob))
        changed = True
    if not changed:
        return None
    return artifacts.put_manifest(r.name, r.tag or "latest", json.dumps(doc, separators=(",", ":")).encode(), media,
                                  creds)

