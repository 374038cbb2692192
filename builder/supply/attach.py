"""The attachments of a pushed image: cosign signs and attests, and the referrers make them found.

Per image manifest, cosign (:mod:`builder.supply.cosign`) writes, in its own format:

- ``sig``: its signature of the image's digest (a "simple signing" payload), under ``sha256-<hex>.sig``;
- ``sbom``: an attestation whose predicate is the CycloneDX 1.6 SBOM (``--type cyclonedx``), and
- ``att``: one with the SLSA provenance v1 predicate (``--type slsaprovenance1``), both under
  ``sha256-<hex>.att``.

cosign 2.5 puts none of them where OCI 1.1 discovery looks (its referrers mode is experimental
and only for signatures, and the attestation bundle it would put there needs the public
transparency log to verify), so :func:`refer` does, by hand: one referrer per kind, each carrying
cosign's own signed document (cosign's ``sig`` referrer layout; the attestation's DSSE layer), found
through the referrers API or the referrers tag ``sha256-<hex>`` (``oras discover``).

An image index (a multi-platform target's tags) gets a ``sig`` of its own; its platform images
carry all three.

Example:
    >>> attest(project, cpu, "localhost:5000/ml-runtime@sha256:ab...", content_tag, key)  # doctest: +SKIP
    {'sig': 'sha256:...', 'sbom': 'sha256:...', 'att': 'sha256:...'}
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from builder.config.errors import TargetFailed, UserError
from builder.config.project import Project, Target, TargetView
from builder.oci import artifacts, registry
from builder.supply import cosign, provenance, sbom
from builder.supply.signing import ENVELOPE_TYPE
from builder.supply.verify import verify

#: What cosign's own referrer of a signature carries as config media type (its oci-1-1 mode).
COSIGN_SIG_ARTIFACT = "application/vnd.dev.cosign.artifact.sig.v1+json"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"
#: kind -> the artifactType its referrer is listed with
ARTIFACT_TYPES = {"sig": COSIGN_SIG_ARTIFACT, "sbom": "application/vnd.cyclonedx+json", "att": cosign.IN_TOTO}


def _descriptor(image: str, creds: dict[str, str] | None) -> dict[str, Any]:
    found = artifacts.get_manifest(image, creds)
    if found is None:
        r = registry.Ref.parse(image)
        raise UserError(f"registry {r.host} has no {image} to attach a sig to")
    media, body, digest = found
    return {"mediaType": media, "digest": digest, "size": len(body)}


def _labels(image: str, creds: dict[str, str] | None) -> dict[str, str]:
    """The labels of the pushed image *image*'s configuration, as the registry holds it."""
    found = artifacts.get_manifest(image, creds)
    config_digest = (json.loads(found[1]).get("config") or {}).get("digest") if found else None
    blob = artifacts.get_blob(registry.Ref.parse(image).name, config_digest, creds) if config_digest else None
    return dict((json.loads(blob).get("config") or {}).get("Labels") or {}) if blob else {}


def attest(project: Project, view: TargetView, image: str, content_tag: str | None, key: cosign.SigningKey,
           creds: dict[str, str] | None = None) -> dict[str, str]:
    """Sign *view*'s pushed *image* (``host/repo@sha256:...``) and attest its SBOM and provenance
    with cosign, then list the three as its referrers; return {kind: referrer manifest digest}."""
    _descriptor(image, creds)  # a clear error before cosign's, when the image is not there
    built_at = _labels(image, creds).get("org.opencontainers.image.revision")
    documents = {"sbom": sbom.sbom_json(project, view, image),
                 "att": json.dumps(provenance.statement(project, view, image, content_tag,
                                                        built_at=built_at)["predicate"])}
    cosign.sign(image, key, creds)
    with tempfile.TemporaryDirectory(prefix="builder-attest-") as folder:
        for kind, text in documents.items():
            path = Path(folder) / f"{kind}.json"
            path.write_text(text, encoding="utf-8")
            cosign.attest(image, path, kind, key, creds)
    return refer(image, cosign.IMAGE_KINDS, creds)


def sign_index(index: str, key: cosign.SigningKey, creds: dict[str, str] | None = None) -> dict[str, str]:
    """Sign an image index ``host/repo@sha256:...`` with cosign and list the signature as its referrer."""
    _descriptor(index, creds)
    cosign.sign(index, key, creds)
    return refer(index, cosign.INDEX_KINDS, creds)


def refer(image: str, kinds: Sequence[str], creds: dict[str, str] | None = None) -> dict[str, str]:
    """Make cosign's signature and attestations of *image* its OCI 1.1 referrers, one per kind;
    return {kind: referrer digest}. Each carries the very layer cosign wrote (so it verifies as
    cosign's does); doing it again gives the same referrers, replaced in the index, not added."""
    r = registry.Ref.parse(image)
    subject = _descriptor(image, creds)
    digest = subject["digest"]
    out: dict[str, str] = {}
    for kind in kinds:
        suffix = "sig" if kind == "sig" else "att"
        found = artifacts.get_manifest(f"{r.name}:{artifacts.cosign_tag(digest, suffix)}", creds)
        if found is None:
            raise TargetFailed(f"cosign wrote no {artifacts.cosign_tag(digest, suffix)} for {image}")
        doc = json.loads(found[1])
        if kind == "sig":  # cosign's own referrer layout (cosign sign --registry-referrers-mode=oci-1-1)
            manifest = {**doc, "config": {**doc["config"], "mediaType": COSIGN_SIG_ARTIFACT}}
        else:
            layers = [la for la in doc.get("layers", []) if la.get("mediaType") == ENVELOPE_TYPE
                      and (la.get("annotations") or {}).get("predicateType") == cosign.PREDICATE_TYPES[kind]]
            if not layers:
                raise TargetFailed(f"cosign wrote no {cosign.PREDICATE_TYPES[kind]} attestation for {image}")
            empty = artifacts.push_blob(r.name, artifacts.EMPTY, creds)
            manifest = {"schemaVersion": 2, "mediaType": artifacts.OCI_MANIFEST, "artifactType": ARTIFACT_TYPES[kind],
                        "config": {"mediaType": artifacts.EMPTY_TYPE, "digest": empty, "size": len(artifacts.EMPTY)},
                        "layers": layers[-1:]}
            manifest["annotations"] = {PREDICATE_ANNOTATION: cosign.PREDICATE_TYPES[kind]}
        manifest["subject"] = subject
        manifest["annotations"] = {**manifest.get("annotations", {}), artifacts.KIND_ANNOTATION: kind}
        out[kind] = artifacts.put_referrer(image, manifest, creds)
    return out


def already_attested(image: str, key: cosign.SigningKey, creds: dict[str, str] | None = None) -> dict[str, str]:
    """{kind: referrer digest} when *image* already carries every attachment, valid, signed by *key*
    and listed as a referrer (a reused image pushed again keeps the documents made when it was
    first pushed); else {}."""
    checks = verify(image, key.public_key, creds)
    if not checks or not all(c.ok for c in checks):
        return {}
    listed, _ = artifacts.referrers(image, creds)
    found = {(d.get("annotations") or {}).get(artifacts.KIND_ANNOTATION): d["digest"] for d in listed}
    return {kind: found[kind] for kind in cosign.IMAGE_KINDS} if all(k in found for k in cosign.IMAGE_KINDS) else {}


class Attach:
    """The ``attest`` stage of :class:`builder.images.execute.Executor` (its ``Attester``): made by the
    cli from a signing key, so that the image build never imports the supply chain (a layer above it).

    Each call says what it did through *say*; a failure raises TargetFailed, its message the view's error.
    """

    def __init__(self, project: Project, signer: cosign.SigningKey, say: Callable[[str], object]) -> None:
        self.project, self.signer, self.say = project, signer, say

    def image(self, view: TargetView, digest: str, content_tag: str | None) -> dict[str, str]:
        """Attach to the pushed image of a target view: what it carries already, else sign and attest it."""
        image = f"{registry.Ref.parse(view.primary_ref).name}@{digest}"
        creds = registry.credentials(registry.Ref.parse(image).host)
        try:
            done = already_attested(image, self.signer, creds)
            if done:
                self.say(f"{view.unit}: {image} already carries {', '.join(done)} signed by this key")
            else:
                done = attest(self.project, view, image, content_tag, self.signer, creds)
                self.say(f"{view.unit}: signed and attached {', '.join(done)} to {image}")
        except (UserError, TargetFailed) as exc:
            raise TargetFailed(f"attaching the SBOM, provenance and signature failed: {exc}") from None
        return done

    def index(self, target: Target, digest: str) -> dict[str, str]:
        """Sign the index *digest* of a multi-platform target."""
        image = f"{registry.Ref.parse(target.primary_ref).name}@{digest}"
        try:
            done = sign_index(image, self.signer, registry.credentials(registry.Ref.parse(image).host))
        except (UserError, TargetFailed) as exc:
            raise TargetFailed(f"signing the index failed: {exc}") from None
        self.say(f"{target.name}: signed the index {image}")
        return done
