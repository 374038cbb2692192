"""The attachments of a pushed image: what is signed, and under which kind it is attached.

Three kinds per image manifest, each a signed DSSE envelope attached to the image's digest
(:mod:`builder.oci.artifacts`: OCI 1.1 ``subject``, and the tag ``sha256-<hex>.<kind>``):

- ``sig``: a cosign-style "simple signing" payload naming the repository and the manifest digest;
- ``sbom``: an in-toto statement about the digest whose predicate is the CycloneDX 1.6 SBOM;
- ``att``: the in-toto statement with the SLSA provenance v1 predicate.

An image index (a multi-platform target's tags) gets a ``sig`` of its own; its platform images
carry all three.

Example:
    >>> attest(project, cpu, "localhost:5000/ml-runtime@sha256:ab...", content_tag, signer)
    {'sig': 'sha256:...', 'sbom': 'sha256:...', 'att': 'sha256:...'}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from securesystemslib.signer import CryptoSigner

from builder.config.project import Project, ResolvedTarget
from builder.oci import artifacts, registry
from builder.supply import provenance, sbom
from builder.supply.signing import ENVELOPE_TYPE, seal

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
IN_TOTO = "application/vnd.in-toto+json"
CYCLONEDX_PREDICATE = "https://cyclonedx.org/bom"
#: kind -> the artifactType its manifest carries
ARTIFACT_TYPES = {"sig": SIMPLE_SIGNING, "sbom": "application/vnd.cyclonedx+json", "att": "application/vnd.in-toto+json"}
IMAGE_KINDS = ("sig", "sbom", "att")
INDEX_KINDS = ("sig",)


def signature_payload(image: str) -> bytes:
    """The signed claim "this repository's manifest *image* digest is vouched for" (cosign simple signing).

    Example:
        >>> json.loads(signature_payload("localhost:5000/ml-runtime@sha256:ab"))["critical"]["image"]
        {'docker-manifest-digest': 'sha256:ab'}
    """
    r = registry.Ref.parse(image)
    return json.dumps({
        "critical": {"identity": {"docker-reference": r.name}, "image": {"docker-manifest-digest": r.digest},
                     "type": "cosign container image signature"},
        "optional": {"creator": f"ml-image-builder {sbom.builder_version()}"},
    }, sort_keys=True).encode()


def sbom_statement(image: str, bom_json: str) -> bytes:
    """An in-toto statement about *image* whose predicate is the CycloneDX document."""
    return json.dumps({"_type": provenance.STATEMENT_TYPE, "subject": provenance.subject(image),
                       "predicateType": CYCLONEDX_PREDICATE, "predicate": json.loads(bom_json)}).encode()


def _put(image: str, kind: str, envelope: bytes, creds: dict[str, str] | None) -> str:
    return artifacts.attach(image, kind, ENVELOPE_TYPE, envelope, artifact_type=ARTIFACT_TYPES[kind], creds=creds)


def attest(project: Project, target: ResolvedTarget, image: str, content_tag: str | None, signer: CryptoSigner,
           creds: dict[str, str] | None = None) -> dict[str, str]:
    """Make, sign and attach the signature, SBOM and provenance of *target*'s pushed *image*
    (``host/repo@sha256:...``); return {kind: attachment manifest digest}."""
    bom = sbom.sbom_json(project, target, image)
    statement = provenance.statement(project, target, image, content_tag)
    documents = {
        "sig": seal(signature_payload(image), SIMPLE_SIGNING, signer),
        "sbom": seal(sbom_statement(image, bom), IN_TOTO, signer),
        "att": seal(json.dumps(statement).encode(), IN_TOTO, signer),
    }
    return {kind: _put(image, kind, envelope, creds) for kind, envelope in documents.items()}


def sign_index(index: str, signer: CryptoSigner, creds: dict[str, str] | None = None) -> dict[str, str]:
    """Sign and attach the signature of an image index ``host/repo@sha256:...``; return {"sig": digest}."""
    return {"sig": _put(index, "sig", seal(signature_payload(index), SIMPLE_SIGNING, signer), creds)}


def already_attested(image: str, signer: CryptoSigner, creds: dict[str, str] | None = None) -> dict[str, str]:
    """{kind: attachment digest} when *image* already carries every attachment, valid and signed by
    *signer*'s key (a reused image pushed again keeps the documents made when it was first pushed); else {}."""
    from builder.supply.verify import verify

    checks = verify(image, signer.public_key, creds)
    if not checks or not all(c.ok for c in checks):
        return {}
    found = {kind: artifacts.find(image, kind, creds) for kind in IMAGE_KINDS}
    return {kind: a.digest for kind, a in found.items() if a is not None} if all(found.values()) else {}


def attest_published(project: Project, pushed: Sequence[tuple[ResolvedTarget, str, str | None]], signer: CryptoSigner,
                     say: Callable[[str], object]) -> dict[str, str]:
    """Attach to every pushed ``(target view, manifest digest, content tag)``, and sign the index of each
    multi-platform target among them; return {unit: error} for those that failed.

    Each record in dist/published.json gets ``attachments``: {kind: attachment digest}.
    """
    from builder.config.errors import TargetFailed, UserError
    from builder.images.publish import amend

    failed: dict[str, str] = {}
    for target, digest, content_tag in pushed:
        image = f"{registry.Ref.parse(target.primary_ref).name}@{digest}"
        creds = registry.credentials(registry.Ref.parse(image).host)
        try:
            done = already_attested(image, signer, creds)
            if done:
                say(f"{target.unit}: {image} already carries {', '.join(done)} signed by this key")
            else:
                done = attest(project, target, image, content_tag, signer, creds)
                say(f"{target.unit}: signed and attached {', '.join(done)} to {image}")
        except (UserError, TargetFailed) as exc:
            failed[target.unit] = f"attaching the SBOM, provenance and signature failed: {exc}"
            continue
        amend(project.root, target.unit, {"attachments": done})
    for name in dict.fromkeys(t.name for t, _, _ in pushed if len(t.platforms) > 1):
        ref = project.target(name).primary_ref
        creds = registry.credentials(registry.Ref.parse(ref).host)
        try:
            index = registry.manifest_digest(ref, creds)
            if index is None:
                continue
            image = f"{registry.Ref.parse(ref).name}@{index}"
            amend(project.root, name, {"attachments": sign_index(image, signer, creds)})
            say(f"{name}: signed the index {image}")
        except (UserError, TargetFailed) as exc:
            failed[name] = f"signing the index failed: {exc}"
    return failed
