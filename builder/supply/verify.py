"""``builder verify REF``: does the image REF names carry a valid signature, SBOM and provenance?

REF (a tag or ``@sha256:`` reference) is resolved to its manifest digest in the registry. For an
image manifest, its three attachments (``sig``, ``sbom``, ``att``: see
:mod:`builder.supply.attach`) are looked up by that digest, through the referrers API where the
registry has one, else under ``sha256-<hex>.<kind>``; each must be a DSSE envelope the public key
verifies, and what it signs must name exactly that digest (the simple-signing payload's manifest
digest, the statements' subject, the SBOM's ``metadata.component``). The SBOM must also be valid
CycloneDX 1.6. For an image index, its own ``sig`` and every platform image are checked.

One :class:`Check` per kind and image, each a line: ``PASS sig: ...`` or ``FAIL sbom: ...``.

Example:
    >>> [c.line() for c in verify("localhost:5000/ml-runtime:cpu", load_public_key("cosign.pub"))][0]
    'PASS sig: signed by key 922d4954880d, names localhost:5000/ml-runtime@sha256:...'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from securesystemslib.signer import SSlibKey

from builder.config.errors import UserError
from builder.oci import artifacts, registry
from builder.supply import attach, provenance
from builder.supply.sbom import validate
from builder.supply.signing import BadEnvelope, unseal


@dataclass(frozen=True)
class Check:
    """The result of one check: which (kind, and platform for an index), whether it held, and why."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.detail}"


class _Failed(Exception):
    pass


def verify(ref: str, key: SSlibKey, creds: dict[str, str] | None = None) -> list[Check]:
    """Every check of the image (or index) *ref* names, against *key*.

    A registry that is unreachable or refuses access raises :class:`UserError`; everything about the
    image and its attachments is a :class:`Check`.
    """
    r = registry.Ref.parse(ref)
    if creds is None:
        creds = registry.credentials(r.host)
    found = artifacts.get_manifest(ref, creds)
    if found is None:
        return [Check("image", False, f"registry {r.host} has no {ref}")]
    media, body, digest = found
    if r.digest and r.digest != digest:
        return [Check("image", False, f"registry {r.host} served {digest} for {ref}")]
    subject = f"{r.name}@{digest}"
    if media not in (artifacts.OCI_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json"):
        return _image(subject, key, creds, attach.IMAGE_KINDS, "")
    checks = _image(subject, key, creds, attach.INDEX_KINDS, " [index]")
    for entry in json.loads(body).get("manifests", []):
        platform = entry.get("platform") or {}
        if platform.get("os") in (None, "unknown"):
            continue  # buildx's attestation manifests are not images
        label = f" [{platform.get('os')}/{platform.get('architecture')}]"
        checks += _image(f"{r.name}@{entry['digest']}", key, creds, attach.IMAGE_KINDS, label)
    return checks


def _image(subject: str, key: SSlibKey, creds: dict[str, str] | None, kinds: tuple[str, ...],
           label: str) -> list[Check]:
    listed = artifacts.referrers(subject, creds)
    checks = []
    for kind in kinds:
        try:
            detail = _check(subject, kind, key, creds, listed)
            checks.append(Check(kind + label, True, detail))
        except _Failed as exc:
            checks.append(Check(kind + label, False, str(exc)))
        except UserError as exc:  # e.g. the tag names something that is no attachment
            checks.append(Check(kind + label, False, str(exc)))
    return checks


def _check(subject: str, kind: str, key: SSlibKey, creds: dict[str, str] | None,
           listed: list[dict[str, Any]] | None) -> str:
    """What holds for the first attachment of *kind* that passes every check; else :class:`_Failed`
    with why the first one failed (a registry with referrers may list older attachments too)."""
    digest = registry.Ref.parse(subject).digest or ""
    found = artifacts.find_all(subject, kind, creds, listed)
    if not found:
        where = "the referrers API lists none; " if listed is not None else ""
        raise _Failed(f"no attachment for {subject} ({where}no tag {artifacts.fallback_tag(digest, kind)})")
    failures = []
    for attachment in found:
        try:
            return _check_one(subject, digest, attachment, key)
        except _Failed as exc:
            failures.append(exc)
    raise failures[0]


def _check_one(subject: str, digest: str, found: artifacts.Attachment, key: SSlibKey) -> str:
    kind = found.kind
    if found.subject is not None and found.subject != digest:
        raise _Failed(f"the attachment under {found.found_by} is attached to {found.subject}, not {digest}")
    try:
        payload_type, payload = unseal(found.payload, key)
    except BadEnvelope as exc:
        raise _Failed(f"{found.found_by}: {exc}") from None
    try:
        doc = json.loads(payload)
    except ValueError:
        raise _Failed(f"{found.found_by}: the signed payload is not JSON") from None
    signed = f"signed by key {key.keyid[:12]}"
    if kind == "sig":
        named = ((doc.get("critical") or {}).get("image") or {}).get("docker-manifest-digest")
        if payload_type != attach.SIMPLE_SIGNING or named != digest:
            raise _Failed(f"{found.found_by}: the signature is for {named} ({payload_type}), not {digest}")
        return f"{signed}, names {subject}"
    named = _statement_digest(doc, payload_type)
    if named != digest:
        raise _Failed(f"{found.found_by}: the signed statement is about {named}, not {digest}")
    predicate = doc.get("predicate") or {}
    if kind == "sbom":
        if doc.get("predicateType") != attach.CYCLONEDX_PREDICATE:
            raise _Failed(f"{found.found_by}: predicate {doc.get('predicateType')}, not {attach.CYCLONEDX_PREDICATE}")
        problem = validate(json.dumps(predicate))
        if problem:
            raise _Failed(f"{found.found_by}: the SBOM is not valid CycloneDX 1.6: {problem}")
        component = (predicate.get("metadata") or {}).get("component") or {}
        if component.get("version") != digest:
            raise _Failed(f"{found.found_by}: the SBOM describes {component.get('version')}, not {digest}")
        return f"{signed}, CycloneDX {predicate.get('specVersion')}, {len(predicate.get('components', []))} " \
               f"components, names {subject}"
    if doc.get("predicateType") != provenance.SLSA_PROVENANCE:
        raise _Failed(f"{found.found_by}: predicate {doc.get('predicateType')}, not {provenance.SLSA_PROVENANCE}")
    params = (predicate.get("buildDefinition") or {}).get("externalParameters") or {}
    source: dict[str, Any] = next((d for d in (predicate.get("buildDefinition") or {}).get("resolvedDependencies", [])
                   if d.get("name") == "source"), {})
    revision = (source.get("digest") or {}).get("gitCommit", "unknown")[:12]
    dirty = "-dirty" if (source.get("annotations") or {}).get("dirty") else ""
    return f"{signed}, SLSA provenance v1: target {params.get('target')} ({params.get('platform')}) built " \
           f"from {revision}{dirty}, names {subject}"


def _statement_digest(doc: dict[str, Any], payload_type: str) -> str | None:
    if payload_type != attach.IN_TOTO or doc.get("_type") != provenance.STATEMENT_TYPE:
        raise _Failed(f"the signed payload is no in-toto statement v1 ({payload_type})")
    subjects = doc.get("subject") or []
    hexes = [(s.get("digest") or {}).get("sha256") for s in subjects]
    return f"sha256:{hexes[0]}" if len(hexes) == 1 and hexes[0] else f"{len(subjects)} subjects"
