"""DSSE envelopes signed with the user's key (securesystemslib), and their verification.

The private key is a PEM file (``builder build --sign-key PATH``) or PEM text in the environment
variable ``BUILDER_SIGNING_KEY``; an encrypted key takes its passphrase from
``BUILDER_SIGNING_KEY_PASSWORD``. ECDSA (P-256/384/521), Ed25519 and RSA keys work. The key
is read in the builder's process only: it is never printed, never passed to the engine and
never in a layer. Errors name the path or the variable, never the key. The public key that
verifies is a PEM file (``builder verify --key PUB``) or PEM text in ``BUILDER_VERIFY_KEY``.

Envelopes are standard DSSE (``payloadType``, base64 ``payload``, ``signatures`` with
``keyid`` and ``sig``): in-toto and securesystemslib verify them as they are.

Example:
    >>> signer = load_signer("cosign.key")
    >>> data = seal(b'{"hello": 1}', "application/json", signer)
    >>> unseal(data, load_public_key("cosign.pub"))
    ('application/json', b'{"hello": 1}')
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from builder.config.errors import UserError

SIGNING_ENV = "BUILDER_SIGNING_KEY"
PASSWORD_ENV = "BUILDER_SIGNING_KEY_PASSWORD"
VERIFY_ENV = "BUILDER_VERIFY_KEY"
ENVELOPE_TYPE = "application/vnd.dsse.envelope.v1+json"


class BadEnvelope(Exception):
    """An envelope that is malformed or whose signature does not verify (the message says which)."""


def _read(path: str | None, env: Mapping[str, str], var: str, flag: str) -> tuple[bytes, str] | None:
    """(PEM bytes, where they came from) from *path*, else the variable *var*; None if neither is set."""
    if path:
        try:
            return Path(path).read_bytes(), f"{flag} {path}"
        except OSError as exc:
            raise UserError(f"{flag} {path}: cannot read it ({exc.strerror}); give a readable PEM key file") from None
    text = env.get(var)
    if text:
        return text.encode(), f"${var}"
    return None


def load_signer(path: str | None = None, env: Mapping[str, str] | None = None) -> CryptoSigner | None:
    """The signer of *path* (a PEM private key), else of ``$BUILDER_SIGNING_KEY`` (PEM text); None if neither.

    Example:
        >>> load_signer(None, {}) is None
        True
    """
    env = os.environ if env is None else env
    found = _read(path, env, SIGNING_ENV, "--sign-key")
    if found is None:
        return None
    data, where = found
    password = env.get(PASSWORD_ENV)
    try:
        key = load_pem_private_key(data, password.encode() if password else None)
    except TypeError:
        raise UserError(f"{where}: the key is encrypted; set {PASSWORD_ENV} to its passphrase") from None
    except ValueError:
        raise UserError(f"{where}: not a PEM private key (or a wrong {PASSWORD_ENV}); give an ECDSA, "
                        "Ed25519 or RSA private key in PEM, e.g. from 'openssl genpkey -algorithm ed25519'") from None
    try:
        return CryptoSigner(key)
    except (ValueError, TypeError):
        raise UserError(f"{where}: unsupported key type {type(key).__name__}; use ECDSA, Ed25519 or RSA") from None


def load_public_key(path: str | None = None, env: Mapping[str, str] | None = None) -> SSlibKey:
    """The public key of *path* (PEM), else of ``$BUILDER_VERIFY_KEY`` (PEM text).

    Example:
        >>> load_public_key("cosign.pub").keytype
        'ecdsa'
    """
    env = os.environ if env is None else env
    found = _read(path, env, VERIFY_ENV, "--key")
    if found is None:
        raise UserError(f"no public key: pass --key PUB (a PEM file) or set {VERIFY_ENV} to the PEM text")
    data, where = found
    try:
        return SSlibKey.from_crypto(load_pem_public_key(data))
    except (ValueError, TypeError):
        raise UserError(f"{where}: not a PEM public key (ECDSA, Ed25519 or RSA); export it with "
                        "'openssl pkey -in KEY -pubout'") from None


def seal(payload: bytes, payload_type: str, signer: CryptoSigner) -> bytes:
    """A DSSE envelope (JSON) of *payload*, signed by *signer*."""
    envelope = Envelope(payload, payload_type, {})
    envelope.sign(signer)
    return json.dumps(envelope.to_dict(), sort_keys=True).encode()


def unseal(data: bytes, key: SSlibKey) -> tuple[str, bytes]:
    """(payload type, payload) of a DSSE envelope whose signature *key* verifies; else :class:`BadEnvelope`."""
    try:
        envelope = Envelope.from_dict(json.loads(data))
    except (ValueError, KeyError, TypeError) as exc:
        raise BadEnvelope(f"not a DSSE envelope ({exc.__class__.__name__}: {exc})") from None
    try:
        envelope.verify([key], 1)
    except VerificationError:
        keyids = ", ".join(s.keyid[:12] for s in envelope.signatures.values()) or "none"
        raise BadEnvelope(f"no signature verifies with key {key.keyid[:12]} (signed by: {keyids})") from None
    return envelope.payload_type, envelope.payload
