"""``builder verify REF``: does the image REF names carry a valid signature, SBOM and provenance?

REF (a tag or ``@sha256:`` reference) is resolved to its manifest digest in the registry. For an
image manifest, its three attachments (``sig``, ``sbom``, ``att``: see
:mod:`builder.supply.attach`) are read where cosign reads them, ``sha256-<hex>.sig`` and
``.att``, and checked as ``cosign verify`` and ``cosign verify-attestation --type cyclonedx`` /
``slsaprovenance1`` check them: a signature the public key verifies over a payload naming exactly
that digest (the simple-signing payload's manifest digest, the statement's subject). The builder
also checks what cosign does not: the SBOM is valid CycloneDX 1.6 and its ``metadata.component``
is that digest. For an image index, its own ``sig`` and every platform image are checked. No
cosign is needed to verify.

One :class:`Check` per kind and image, each a line: ``PASS sig: ...`` or ``FAIL sbom: ...``.

Example:
    >>> [c.line() for c in verify("localhost:5000/ml-runtime:cpu", load_public_key("cosign.pub"))][0]  # doctest: +SKIP
    'PASS sig: signed by key 922d4954880d, names localhost:5000/ml-runtime@sha256:...'
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from securesystemslib.signer import SSlibKey

from builder.config.errors import UserError
from builder.oci import artifacts, registry
from builder.supply import cosign, provenance
from builder.supply.sbom import validate
from builder.supply.signing import ENVELOPE_TYPE, BadEnvelope, unseal, verify_blob

#: cosign attest writes in-toto Statement v0.1; v1 is the same shape.
STATEMENT_TYPES = ("https://in-toto.io/Statement/v0.1", provenance.STATEMENT_TYPE)


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
        return _image(subject, key, creds, cosign.IMAGE_KINDS, "")
    checks = _image(subject, key, creds, cosign.INDEX_KINDS, " [index]")
    for entry in json.loads(body).get("manifests", []):
        platform = entry.get("platform") or {}
        if platform.get("os") in (None, "unknown"):
            continue  # buildx's attestation manifests are not images
        label = f" [{platform.get('os')}/{platform.get('architecture')}]"
        checks += _image(f"{r.name}@{entry['digest']}", key, creds, cosign.IMAGE_KINDS, label)
    return checks


def signed(image: str, keys: Sequence[SSlibKey], creds: dict[str, str] | None = None) -> bool:
    """Whether *image* (``<repository>@sha256:...``) carries a cosign signature by one of *keys* naming
    its digest, as ``cosign verify`` checks it: what ``builder build`` trusts in a shared registry
    (:mod:`builder.images.trust`). A registry that refuses or fails the reads counts as no signature."""
    r = registry.Ref.parse(image)
    if not r.digest:
        return False
    if creds is None:
        creds = registry.credentials(r.host)
    tag = artifacts.cosign_tag(r.digest, "sig")
    try:
        found = artifacts.get_manifest(f"{r.name}:{tag}", creds)
    except (UserError, registry.RegistryFault):
        return False
    for key in keys:
        try:
            _check_sig(image, r.digest, tag, found, key, creds)
            return True
        except (_Failed, UserError, registry.RegistryFault):
            continue
    return False


def _image(subject: str, key: SSlibKey, creds: dict[str, str] | None, kinds: tuple[str, ...],
           label: str) -> list[Check]:
    r = registry.Ref.parse(subject)
    digest = r.digest or ""
    tags = {suffix: artifacts.cosign_tag(digest, suffix) for suffix in ("sig", "att")}
    found = {suffix: artifacts.get_manifest(f"{r.name}:{tag}", creds) for suffix, tag in tags.items()
             if suffix == "sig" or set(kinds) - {"sig"}}
    checks = []
    for kind in kinds:
        try:
            if kind == "sig":
                detail = _check_sig(subject, digest, tags["sig"], found["sig"], key, creds)
            else:
                detail = _check_attestation(subject, digest, kind, tags["att"], found["att"], key, creds)
            checks.append(Check(kind + label, True, detail))
        except (_Failed, UserError) as exc:  # UserError: e.g. the tag names something that holds no blob
            checks.append(Check(kind + label, False, str(exc)))
    return checks


def _layers(subject: str, found: tuple[str, bytes, str], media_type: str,
            creds: dict[str, str] | None) -> list[tuple[dict[str, Any], bytes]]:
    """(descriptor, blob) of each layer of *media_type* in the manifest *found*."""
    name = registry.Ref.parse(subject).name
    out = []
    for layer in json.loads(found[1]).get("layers") or []:
        if layer.get("mediaType") == media_type:
            blob = artifacts.get_blob(name, layer["digest"], creds)
            if blob is not None:
                out.append((layer, blob))
    return out


def _check_sig(subject: str, digest: str, tag: str, found: tuple[str, bytes, str] | None, key: SSlibKey,
               creds: dict[str, str] | None) -> str:
    """What cosign verify checks: a signature of the payload the key verifies, naming *digest*."""
    if found is None:
        raise _Failed(f"no signature for {subject} (no tag {tag})")
    named = []
    for layer, payload in _layers(subject, found, cosign.SIMPLE_SIGNING, creds):
        try:
            verify_blob(payload, (layer.get("annotations") or {}).get(cosign.SIGNATURE_ANNOTATION, ""), key)
        except BadEnvelope:
            continue
        try:
            doc = json.loads(payload)
        except ValueError:
            named.append("a payload that is not JSON")
            continue
        claimed = ((doc.get("critical") or {}).get("image") or {}).get("docker-manifest-digest")
        if claimed == digest:
            return f"signed by key {key.keyid[:12]}, names {subject}"
        named.append(str(claimed))
    if named:
        raise _Failed(f"tag {tag}: the signature is for {named[0]}, not {digest}")
    raise _Failed(f"tag {tag}: no signature verifies with key {key.keyid[:12]}")


def signed_provenance(subject: str, key: SSlibKey, creds: dict[str, str] | None = None) -> dict[str, Any]:
    """The provenance statement attached to the image *subject* (``repository@sha256:...``), once its
    signature verifies with *key* and it names that digest (what the ``att`` check passes); else
    :class:`UserError` saying why: what ``builder verify --rebuild`` rebuilds from."""
    r = registry.Ref.parse(subject)
    if creds is None:
        creds = registry.credentials(r.host)
    digest = r.digest or ""
    tag = artifacts.cosign_tag(digest, "att")
    try:
        return _verified_attestation(subject, digest, "att", tag,
                                     artifacts.get_manifest(f"{r.name}:{tag}", creds), key, creds)[0]
    except _Failed as exc:
        raise UserError(f"{subject}: no provenance to rebuild from: {exc}") from None


def _check_attestation(subject: str, digest: str, kind: str, tag: str, found: tuple[str, bytes, str] | None,
                       key: SSlibKey, creds: dict[str, str] | None) -> str:
    return _verified_attestation(subject, digest, kind, tag, found, key, creds)[1]


def _verified_attestation(subject: str, digest: str, kind: str, tag: str, found: tuple[str, bytes, str] | None,
                          key: SSlibKey, creds: dict[str, str] | None) -> tuple[dict[str, Any], str]:
    """What cosign verify-attestation --type checks (a statement of that predicate type, signed by
    the key, about *digest*), and that the predicate is what the builder makes: (the statement, why it holds)."""
    wanted = cosign.PREDICATE_TYPES[kind]
    if found is None:
        raise _Failed(f"no attestation for {subject} (no tag {tag})")
    statements = []
    for _, envelope in _layers(subject, found, ENVELOPE_TYPE, creds):
        try:
            payload_type, payload = unseal(envelope, key)
            doc = json.loads(payload)
        except (BadEnvelope, ValueError):
            continue
        if payload_type == cosign.IN_TOTO and isinstance(doc, dict):
            statements.append(doc)
    if not statements:
        raise _Failed(f"tag {tag}: no attestation verifies with key {key.keyid[:12]}")
    typed = [doc for doc in statements if doc.get("predicateType") == wanted]
    if not typed:
        raise _Failed(f"tag {tag}: no signed attestation of type {cosign.TYPES[kind]} ({wanted})")
    failures = []
    for doc in reversed(typed):  # the newest first (cosign attest --replace keeps one)
        try:
            return doc, _check_statement(subject, digest, kind, tag, doc, key)
        except _Failed as exc:
            failures.append(exc)
    raise failures[0]


def _check_statement(subject: str, digest: str, kind: str, tag: str, doc: dict[str, Any], key: SSlibKey) -> str:
    named = _statement_digest(doc)
    if named != digest:
        raise _Failed(f"tag {tag}: the signed statement is about {named}, not {digest}")
    signed = f"signed by key {key.keyid[:12]}"
    predicate = doc.get("predicate") or {}
    if kind == "sbom":
        problem = validate(json.dumps(predicate))
        if problem:
            raise _Failed(f"tag {tag}: the SBOM is not valid CycloneDX 1.6: {problem}")
        component = (predicate.get("metadata") or {}).get("component") or {}
        if component.get("version") != digest:
            raise _Failed(f"tag {tag}: the SBOM describes {component.get('version')}, not {digest}")
        return f"{signed}, CycloneDX {predicate.get('specVersion')}, {len(predicate.get('components', []))} " \
               f"components, names {subject}"
    params = (predicate.get("buildDefinition") or {}).get("externalParameters") or {}
    source: dict[str, Any] = next((d for d in (predicate.get("buildDefinition") or {}).get("resolvedDependencies", [])
                                   if d.get("name") == "source"), {})
    revision = (source.get("digest") or {}).get("gitCommit", "unknown")[:12]
    dirty = "-dirty" if (source.get("annotations") or {}).get("dirty") else ""
    return f"{signed}, SLSA provenance v1: target {params.get('target')} ({params.get('platform')}) built " \
           f"from {revision}{dirty}, names {subject}"


def _statement_digest(doc: dict[str, Any]) -> str | None:
    if doc.get("_type") not in STATEMENT_TYPES:
        raise _Failed(f"the signed payload is no in-toto statement ({doc.get('_type')})")
    subjects = doc.get("subject") or []
    hexes = [(s.get("digest") or {}).get("sha256") for s in subjects]
    return f"sha256:{hexes[0]}" if len(hexes) == 1 and hexes[0] else f"{len(subjects)} subjects"
