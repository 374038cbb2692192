"""OCI 1.1 artifacts attached to an image digest, through the registry API: push, find, read.

An attachment is an OCI image manifest with an ``artifactType``, the empty config, one layer
(the attached document) and a ``subject`` descriptor naming the image manifest. A registry that
implements the referrers API (OCI distribution 1.1) indexes it by that subject; every registry
also finds it under the cosign-style tag ``sha256-<hex>.<kind>`` (Debian's docker-registry 2.8
has no referrers API), which is how :func:`find` falls back.

Example:
    >>> attach("localhost:5000/ml-runtime@sha256:ab...", "sbom", "application/vnd.dsse.envelope.v1+json",
    ...        envelope_bytes, artifact_type="application/vnd.cyclonedx+json")
    'sha256:...'
    >>> find("localhost:5000/ml-runtime@sha256:ab...", "sbom").payload == envelope_bytes
    True
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
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


def fallback_tag(digest: str, kind: str) -> str:
    """The cosign-style tag an attachment of *kind* to *digest* goes under.

    Example:
        >>> fallback_tag("sha256:ab12", "sig")
        'sha256-ab12.sig'
    """
    return f"{digest.replace(':', '-')}.{kind}"


@dataclass(frozen=True)
class Attachment:
    """One attachment as found in the registry: where, what it says it is attached to, its document."""

    digest: str
    kind: str
    artifact_type: str
    #: the subject digest its manifest names (None: the manifest has no subject)
    subject: str | None
    media_type: str
    payload: bytes
    #: how it was found: "referrers" or "tag <tag>"
    found_by: str


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


def delete_manifest(name: str, digest: str, creds: dict[str, str] | None = None) -> None:
    """Delete a manifest by digest (the registry must allow deletes); its tags go with it."""
    r = Ref.parse(name)
    _request("DELETE", f"{_base_url(r.host)}/v2/{r.repository}/manifests/{digest}", r.host, creds, {})


def attach(subject: str, kind: str, media_type: str, payload: bytes, *, artifact_type: str,
           creds: dict[str, str] | None = None) -> str:
    """Attach *payload* to the manifest *subject* (``host/repo@sha256:...``) as an OCI 1.1 artifact,
    also tagged ``sha256-<hex>.<kind>``; return the artifact manifest's digest.

    Example:
        >>> attach("localhost:5000/ml-runtime@sha256:ab...", "sig", "application/vnd.dsse.envelope.v1+json",
        ...        b"{...}", artifact_type="application/vnd.dev.cosign.simplesigning.v1+json")
        'sha256:...'
    """
    r = Ref.parse(subject)
    if not r.digest:
        raise UserError(f"attach: {subject} names no digest; attachments go on a manifest digest")
    found = get_manifest(subject, creds)
    if found is None:
        raise UserError(f"registry {r.host} has no {subject} to attach a {kind} to")
    subject_type, subject_body, _ = found
    push_blob(r.name, EMPTY, creds)
    layer = push_blob(r.name, payload, creds)
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": EMPTY_TYPE, "digest": digest_of(EMPTY), "size": len(EMPTY)},
        "layers": [{"mediaType": media_type, "digest": layer, "size": len(payload)}],
        "subject": {"mediaType": subject_type, "digest": r.digest, "size": len(subject_body)},
        "annotations": {KIND_ANNOTATION: kind},
    }
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return put_manifest(r.name, fallback_tag(r.digest, kind), body, OCI_MANIFEST, creds)


def referrers(subject: str, creds: dict[str, str] | None = None) -> list[dict[str, Any]] | None:
    """The referrers API's descriptors for *subject*, or None when the registry has no referrers API."""
    r = Ref.parse(subject)
    url = f"{_base_url(r.host)}/v2/{r.repository}/referrers/{r.digest}"
    try:
        status, headers, body = _request("GET", url, r.host, creds, {"Accept": OCI_INDEX})
    except UserError:
        return None  # e.g. 400/405 from a registry that does not know the endpoint
    if status == 404 or not _header(headers, "Content-Type").startswith(OCI_INDEX):
        return None
    manifests: list[dict[str, Any]] = json.loads(body).get("manifests", [])
    return manifests


def find(subject: str, kind: str, creds: dict[str, str] | None = None,
         listed: list[dict[str, Any]] | None = None) -> Attachment | None:
    """The first attachment of *kind* to *subject* (see :func:`find_all`), or None."""
    found = find_all(subject, kind, creds, listed)
    return found[0] if found else None


def find_all(subject: str, kind: str, creds: dict[str, str] | None = None,
             listed: list[dict[str, Any]] | None = None) -> list[Attachment]:
    """The attachments of *kind* to *subject* (``host/repo@sha256:...``): those the referrers
    descriptors *listed* name (see :func:`referrers`), then the one under the fallback tag.

    A manifest under the tag that is no attachment (an OCI manifest with one layer) is a :class:`UserError`.
    """
    r = Ref.parse(subject)
    if not r.digest:
        raise UserError(f"find: {subject} names no digest")
    tag = fallback_tag(r.digest, kind)
    candidates = [(f"{r.name}@{d['digest']}", "referrers") for d in listed or []
                  if (d.get("annotations") or {}).get(KIND_ANNOTATION) == kind]
    candidates.append((f"{r.name}:{tag}", f"tag {tag}"))
    out: list[Attachment] = []
    for reference, how in candidates:
        found = get_manifest(reference, creds)
        if found is None or any(a.digest == found[2] for a in out):
            continue
        media, body, digest = found
        doc = json.loads(body)
        layers = doc.get("layers") or []
        if media != OCI_MANIFEST or len(layers) != 1:
            raise UserError(f"{reference} is no attachment (an OCI manifest with one layer) but a {media}")
        payload = get_blob(r.name, layers[0]["digest"], creds)
        if payload is not None:
            out.append(Attachment(digest, kind, doc.get("artifactType", ""), (doc.get("subject") or {}).get("digest"),
                                  layers[0].get("mediaType", ""), payload, how))
    return out


def _header(headers: dict[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), "")
