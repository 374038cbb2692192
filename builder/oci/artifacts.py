"""OCI 1.1 referrers of an image digest, through the registry API: put, list, read.

A referrer is an OCI image manifest whose ``subject`` descriptor names the image manifest (and an
``artifactType``, or a config media type that says what it is). A registry with the referrers API
(distribution-spec 1.1) indexes it by that subject; for one without (Debian's docker-registry 2.8)
the client keeps the index itself, under the referrers tag schema's tag ``sha256-<hex>``
(:func:`put_referrer`), where ``oras discover`` and go-containerregistry look. cosign's own
``sha256-<hex>.sig`` and ``.att`` tags (:func:`cosign_tag`) are another scheme beside it: cosign
reads those, oras these.

Example:
    >>> put_referrer("localhost:5000/ml-runtime@sha256:ab...", manifest)  # doctest: +SKIP
    'sha256:...'
    >>> referrers("localhost:5000/ml-runtime@sha256:ab...")  # doctest: +SKIP
    ([{'mediaType': 'application/vnd.oci.image.manifest.v1+json', 'digest': 'sha256:...', ...}], 'tag sha256-ab...')
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from builder.config.errors import UserError
from builder.oci.registry import MANIFEST_TYPES, Ref, _base_url, _request

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
#: The annotation naming the attachment's kind (sig, sbom, att) in its manifest.
KIND_ANNOTATION = "dev.ml-image-builder.attachment"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def get_manifest(ref: str, creds: dict[str, str] | None = None) -> tuple[str, bytes, str] | None:
    """(media type, body, digest) of the manifest *ref* names, or None when the registry has none."""
    r = Ref.parse(ref)
    url = f"{_base_url(r.host)}/v2/{r.repository}/manifests/{r.digest or r.tag or 'latest'}"
    status, headers, body = _request("GET", url, r.host, creds, {"Accept": MANIFEST_TYPES})
    if status == 404:
        return None
    media = _header(headers, "Content-Type").split(";")[0] or json.loads(body).get("mediaType", "")
    return media, body, digest_of(body)


def get_blob(name: str, digest: str, creds: dict[str, str] | None = None) -> bytes | None:
    """A blob of repository *name* (``host/repo``), checked against its digest; None if absent."""
    r = Ref.parse(name)
    status, _, body = _request("GET", f"{_base_url(r.host)}/v2/{r.repository}/blobs/{digest}", r.host, creds, {})
    if status == 404:
        return None
    if digest_of(body) != digest:
        raise UserError(f"registry {r.host} served blob {digest} of {name} with another digest; the registry is corrupt")
    return body


def push_blob(name: str, data: bytes, creds: dict[str, str] | None = None) -> str:
    """Upload *data* as a blob of repository *name* (monolithic upload; skipped if present); return its digest."""
    r = Ref.parse(name)
    base = _base_url(r.host)
    digest = digest_of(data)
    status, _, _ = _request("HEAD", f"{base}/v2/{r.repository}/blobs/{digest}", r.host, creds, {})
    if status != 404:
        return digest
    _, headers, _ = _request("POST", f"{base}/v2/{r.repository}/blobs/uploads/", r.host, creds, {}, b"")
    location = _header(headers, "Location")
    if not location:
        raise UserError(f"registry {r.host} started a blob upload for {name} without a Location")
    if location.startswith("/"):
        location = base + location
    url = f"{location}{'&' if '?' in location else '?'}digest={digest}"
    _request("PUT", url, r.host, creds, {"Content-Type": "application/octet-stream"}, data)
    return digest


def put_manifest(name: str, reference: str, body: bytes, media_type: str,
                 creds: dict[str, str] | None = None) -> str:
    """Put a manifest under *reference* (a tag or its digest) in repository *name*; return its digest."""
    r = Ref.parse(name)
    _request("PUT", f"{_base_url(r.host)}/v2/{r.repository}/manifests/{reference}", r.host, creds,
             {"Content-Type": media_type}, body)
    return digest_of(body)


def cosign_tag(digest: str, suffix: str) -> str:
    """cosign's tag for the signatures (``sig``) or attestations (``att``) of *digest*.

    Example:
        >>> cosign_tag("sha256:ab12", "sig")
        'sha256-ab12.sig'
    """
    return f"{digest.replace(':', '-')}.{suffix}"


def referrers_tag(digest: str) -> str:
    """The OCI 1.1 referrers tag schema's tag for *digest*: the index listing its referrers where the
    registry has no referrers API (what oras and go-containerregistry read and write).

    Example:
        >>> referrers_tag("sha256:ab12")
        'sha256-ab12'
    """
    return digest.replace(":", "-")


def put_referrer(subject: str, manifest: dict[str, Any], creds: dict[str, str] | None = None) -> str:
    """Put *manifest* (an OCI image manifest whose ``subject`` is *subject*'s) by its digest, and make
    it found as *subject*'s referrer; return its digest.

    A registry with the referrers API says so (the ``OCI-Subject`` header) and indexes it itself;
    for one without (Debian's docker-registry 2.8), the index under :func:`referrers_tag` gets its
    descriptor, as distribution-spec 1.1 says a client does. An older referrer with the same
    :data:`KIND_ANNOTATION` leaves that index: a re-attachment replaces, it does not pile up.
    """
    r = Ref.parse(subject)
    if not r.digest:
        raise UserError(f"attach: {subject} names no digest; referrers go on a manifest digest")
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = digest_of(body)
    _, headers, _ = _request("PUT", f"{_base_url(r.host)}/v2/{r.repository}/manifests/{digest}", r.host, creds,
                             {"Content-Type": OCI_MANIFEST}, body)
    if _header(headers, "OCI-Subject"):
        return digest
    annotations = manifest.get("annotations") or {}
    descriptor: dict[str, Any] = {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(body),
                                  "artifactType": manifest.get("artifactType") or manifest["config"]["mediaType"]}
    if annotations:
        descriptor["annotations"] = annotations
    kind = annotations.get(KIND_ANNOTATION)
    tag = referrers_tag(r.digest)
    found = get_manifest(f"{r.name}:{tag}", creds)
    listed: list[dict[str, Any]] = json.loads(found[1]).get("manifests", []) if found and found[0] == OCI_INDEX else []
    kept = [d for d in listed if d.get("digest") != digest
            and (kind is None or (d.get("annotations") or {}).get(KIND_ANNOTATION) != kind)]
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [*kept, descriptor]}
    put_manifest(r.name, tag, json.dumps(index, sort_keys=True, separators=(",", ":")).encode(), OCI_INDEX, creds)
    return digest


def referrers(subject: str, creds: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], str]:
    """The descriptors of *subject*'s referrers and where they were read: from the referrers API
    where the registry has one, else from the index under :func:`referrers_tag` (as ``oras discover``
    reads them); ([], where) when there are none."""
    r = Ref.parse(subject)
    if not r.digest:
        raise UserError(f"referrers: {subject} names no digest")
    url = f"{_base_url(r.host)}/v2/{r.repository}/referrers/{r.digest}"
    try:
        status, headers, body = _request("GET", url, r.host, creds, {"Accept": OCI_INDEX})
    except UserError:
        status, headers, body = 404, {}, b""  # e.g. 400/405 from a registry that does not know the endpoint
    if status != 404 and _header(headers, "Content-Type").startswith(OCI_INDEX):
        return list(json.loads(body).get("manifests", [])), "the referrers API"
    tag = referrers_tag(r.digest)
    found = get_manifest(f"{r.name}:{tag}", creds)
    listed = json.loads(found[1]).get("manifests", []) if found and found[0] == OCI_INDEX else []
    return list(listed), f"tag {tag}"


def _header(headers: dict[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), "")
