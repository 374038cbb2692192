"""cosign, run by the builder: it signs images and attaches attestations in its own format.

What cosign writes is what cosign (and the admission controllers built on it) verifies, by
construction: the signature under the tag ``sha256-<hex>.sig``, the attestations (DSSE envelopes
of in-toto statements) under ``sha256-<hex>.att``. No transparency log is used
(``--tlog-upload=false``): the registry may be private and offline, and the key is the trust.

The key reaches cosign only through its environment (``--key env://BUILDER_COSIGN_KEY`` and
``COSIGN_PASSWORD``); registry credentials from the environment go in a private Docker config for
the call. cosign's messages are passed on in errors (they never hold the key).

Its formats (the kinds, media and predicate types) and the key it is handed (:class:`SigningKey`,
which :mod:`builder.supply.signing` loads) are named here: :mod:`~builder.supply.attach` makes
the attachments in them, :mod:`~builder.supply.verify` checks them.

Example:
    >>> sign("localhost:5000/ml-runtime@sha256:ab...", key)  # doctest: +SKIP
    >>> attest("localhost:5000/ml-runtime@sha256:ab...", Path("bom.json"), "cyclonedx", key)  # doctest: +SKIP
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from securesystemslib.signer import SSlibKey

from builder.config.errors import TargetFailed, UserError
from builder.oci import registry
from builder.oci.secrets import COSIGN, child_env
from builder.supply.provenance import SLSA_PROVENANCE

#: cosign reads a key's password from it.
COSIGN_PASSWORD_ENV = "COSIGN_PASSWORD"
#: The variable cosign's ``--key env://...`` reads the key from, in cosign's environment only.
KEY_ENV = "BUILDER_COSIGN_KEY"

#: What cosign writes for an image (its signature, an attestation per :data:`TYPES`), and for an index.
IMAGE_KINDS = ("sig", "sbom", "att")
INDEX_KINDS = ("sig",)
#: cosign attest --type for each attestation the builder makes.
TYPES = {"sbom": "cyclonedx", "att": "slsaprovenance1"}
CYCLONEDX_PREDICATE = "https://cyclonedx.org/bom"
#: kind -> the predicate type its --type stands for
PREDICATE_TYPES = {"sbom": CYCLONEDX_PREDICATE, "att": SLSA_PROVENANCE}
#: The payload cosign signs: a "simple signing" document naming the digest.
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
#: Where cosign keeps a signature: an annotation of the layer holding the signed payload.
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
#: The payload type of cosign's attestations (DSSE envelopes of in-toto statements).
IN_TOTO = "application/vnd.in-toto+json"


@dataclass(frozen=True)
class SigningKey:
    """A private key cosign can sign with: where it came from, its public key, and what cosign is handed
    (:func:`builder.supply.signing.load_signer` makes one)."""

    where: str
    public_key: SSlibKey
    _cosign_key: str = field(repr=False)
    _password: str = field(repr=False)

    def cosign_env(self) -> dict[str, str]:
        """The environment entries under which cosign reads this key (``--key env://BUILDER_COSIGN_KEY``)."""
        return {KEY_ENV: self._cosign_key, COSIGN_PASSWORD_ENV: self._password}


def binary() -> str:
    """The cosign executable; a :class:`UserError` saying how to install it when there is none."""
    found = shutil.which("cosign")
    if found is None:
        raise UserError("signing needs cosign (2.x), which is not installed: 'apt-get install cosign' "
                        "(scripts/setup-host.sh installs it)")
    return found


def _run(args: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # No secret of the environment reaches cosign (secrets.child_env); the key goes in as KEY_ENV only.
    return subprocess.run([binary(), *args], env=child_env(COSIGN, extra), capture_output=True, text=True, check=False,
                          timeout=300)


def _said(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    return lines[-1].removeprefix("Error: ").removeprefix("error during command execution: ") if lines else \
        f"exit {proc.returncode}"


def public_key(text: str, password: str, where: str) -> str:
    """The PEM public key of a cosign-format private key *text* (cosign decrypts it: a wrong
    password fails here, before any build)."""
    proc = _run(["public-key", "--key", f"env://{KEY_ENV}"], {KEY_ENV: text, COSIGN_PASSWORD_ENV: password})
    if proc.returncode != 0:
        raise UserError(f"{where}: cosign cannot read the key ({_said(proc)}); set {COSIGN_PASSWORD_ENV} to "
                        "its password")
    return proc.stdout


@contextmanager
def _registry_env(image: str, creds: dict[str, str] | None) -> Iterator[dict[str, str]]:
    """DOCKER_CONFIG for cosign when the builder has credentials of its own (else cosign reads
    the user's Docker config, as the builder does)."""
    if not creds:
        yield {}
        return
    host = registry.Ref.parse(image).host
    with tempfile.TemporaryDirectory(prefix="builder-cosign-") as folder:
        auth = base64.b64encode(f"{creds['username']}:{creds['password']}".encode()).decode()
        path = Path(folder) / "config.json"
        path.touch(mode=0o600)
        path.write_text(json.dumps({"auths": {host: {"auth": auth}}}))
        yield {"DOCKER_CONFIG": folder}


def _flags(image: str) -> list[str]:
    # Loopback registries speak plain HTTP (registry.is_local), as the builder's own client does.
    return ["--allow-http-registry", "--allow-insecure-registry"] if registry.is_local(registry.Ref.parse(image).host) \
        else []


def _with_key(args: list[str], image: str, key: SigningKey, creds: dict[str, str] | None, what: str) -> None:
    with _registry_env(image, creds) as extra:
        proc = _run([*args, "--key", f"env://{KEY_ENV}", "--tlog-upload=false", "--yes", *_flags(image), image],
                    {**extra, **key.cosign_env()})
    if proc.returncode != 0:
        raise TargetFailed(f"cosign {what} {image} failed: {_said(proc)}")


def sign(image: str, key: SigningKey, creds: dict[str, str] | None = None) -> None:
    """``cosign sign`` the manifest *image* (``host/repo@sha256:...``). Signing again with the same
    key adds nothing: cosign finds the signature it would add already there."""
    _with_key(["sign"], image, key, creds, "sign")


def attest(image: str, predicate: Path, kind: str, key: SigningKey, creds: dict[str, str] | None = None) -> None:
    """``cosign attest --type <kind's type> --replace``: the attestation of that predicate type
    replaces the one already there (a re-push keeps one of each)."""
    _with_key(["attest", "--type", TYPES[kind], "--predicate", str(predicate), "--replace"], image, key, creds,
              f"attest --type {TYPES[kind]}")
