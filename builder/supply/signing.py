"""The user's signing key, handed to cosign; and checking cosign's signatures with the public key.

The private key is a file (``builder build --sign-key PATH``) or its text in the environment
variable ``BUILDER_SIGNING_KEY``, in either form:

- cosign's own encrypted key (``cosign generate-key-pair``), its password in ``COSIGN_PASSWORD``
  (as cosign reads it), else ``BUILDER_SIGNING_KEY_PASSWORD``;
- a PEM private key (ECDSA P-256/384/521, Ed25519 or RSA), encrypted or not (passphrase:
  ``BUILDER_SIGNING_KEY_PASSWORD``).

cosign signs (:mod:`builder.supply.cosign`), and it reads only its own key format; a PEM key is
re-encrypted into that format in memory, under a random password, because cosign 2.5.0's
``import-key-pair`` rejects ECDSA and RSA keys ("unsupported public key type"). The key is checked
when it is loaded (before a build starts), read in the builder's process and handed to cosign
through its environment only: never printed, never on disk, never passed to the engine. Errors
name the path or the variable, never the key.

The public key that verifies is a PEM file (``builder verify --key PUB``, e.g. ``cosign.pub``) or
PEM text in ``BUILDER_VERIFY_KEY``. :func:`verify_blob` and :func:`unseal` check cosign's two
signature forms (a signature over the payload; a DSSE envelope) as cosign does.

Example:
    >>> key = load_signer("cosign.key")          # COSIGN_PASSWORD set  # doctest: +SKIP
    >>> key.public_key.keyid == load_public_key("cosign.pub").keyid  # doctest: +SKIP
    True
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

import nacl.secret
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import FormatError, UnverifiedSignatureError, VerificationError
from securesystemslib.signer import Signature, SSlibKey

from builder.config.errors import UserError
from builder.supply import cosign

SIGNING_ENV = "BUILDER_SIGNING_KEY"
PASSWORD_ENV = "BUILDER_SIGNING_KEY_PASSWORD"
VERIFY_ENV = "BUILDER_VERIFY_KEY"
ENVELOPE_TYPE = "application/vnd.dsse.envelope.v1+json"
#: PEM types of cosign's encrypted key (go-securesystemslib's "encrypted" format: scrypt + nacl/secretbox).
COSIGN_KEY_TYPES = ("ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY")


class BadEnvelope(Exception):
    """A document that is malformed or whose signature does not verify (the message says which)."""


def _read(path: str | None, env: Mapping[str, str], var: str, flag: str) -> tuple[bytes, str] | None:
    """(key bytes, where they came from) from *path*, else the variable *var*; None if neither is set."""
    if path:
        try:
            return Path(path).read_bytes(), f"{flag} {path}"
        except OSError as exc:
            raise UserError(f"{flag} {path}: cannot read it ({exc.strerror}); give a readable key file") from None
    text = env.get(var)
    if text:
        return text.encode(), f"${var}"
    return None


def load_signer(path: str | None = None, env: Mapping[str, str] | None = None) -> cosign.SigningKey | None:
    """The signing key of *path*, else of ``$BUILDER_SIGNING_KEY``; None if neither. Checked now:
    cosign must be installed, and the key readable with its password.

    Example:
        >>> load_signer(None, {}) is None
        True
    """
    env = os.environ if env is None else env
    found = _read(path, env, SIGNING_ENV, "--sign-key")
    if found is None:
        return None
    data, where = found
    cosign.binary()  # before anything else: signing is cosign's
    if any(f"-----BEGIN {t}-----".encode() in data for t in COSIGN_KEY_TYPES):
        password = env.get(cosign.COSIGN_PASSWORD_ENV) or env.get(PASSWORD_ENV) or ""
        text = data.decode("ascii", "replace")
        public = cosign.public_key(text, password, where)
        return cosign.SigningKey(where, _sslib(load_pem_public_key(public.encode())), text, password)
    passphrase = env.get(PASSWORD_ENV)
    try:
        key = load_pem_private_key(data, passphrase.encode() if passphrase else None)
    except TypeError:
        raise UserError(f"{where}: the key is encrypted; set {PASSWORD_ENV} to its passphrase") from None
    except ValueError:
        raise UserError(f"{where}: not a PEM or cosign private key (or a wrong {PASSWORD_ENV}); give a key from "
                        "'cosign generate-key-pair', or an ECDSA, Ed25519 or RSA private key in PEM") from None
    try:
        public_key = _sslib(key.public_key())
    except (ValueError, TypeError):
        raise UserError(f"{where}: unsupported key type {type(key).__name__}; use ECDSA, Ed25519 or RSA") from None
    fresh = secrets.token_urlsafe(32)
    return cosign.SigningKey(where, public_key, to_cosign_key(key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), fresh), fresh)


def to_cosign_key(pkcs8_der: bytes, password: str) -> str:
    """A PKCS#8 private key in cosign's encrypted format (what ``cosign generate-key-pair`` writes):
    the DER sealed with nacl/secretbox under a key scrypt derives from *password*."""
    salt, nonce = secrets.token_bytes(32), secrets.token_bytes(nacl.secret.SecretBox.NONCE_SIZE)
    n, r, p = 32768, 8, 1
    box = nacl.secret.SecretBox(hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p,
                                               maxmem=64 * 1024 * 1024, dklen=nacl.secret.SecretBox.KEY_SIZE))
    doc = json.dumps({
        "kdf": {"name": "scrypt", "params": {"N": n, "r": r, "p": p}, "salt": base64.b64encode(salt).decode()},
        "cipher": {"name": "nacl/secretbox", "nonce": base64.b64encode(nonce).decode()},
        "ciphertext": base64.b64encode(box.encrypt(pkcs8_der, nonce).ciphertext).decode(),
    }).encode()
    body = base64.b64encode(doc).decode()
    lines = "\n".join(body[i:i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN {COSIGN_KEY_TYPES[0]}-----\n{lines}\n-----END {COSIGN_KEY_TYPES[0]}-----\n"


def _sslib(public: object) -> SSlibKey:
    # cosign signs RSA with PKCS#1 v1.5 (securesystemslib's default for RSA is PSS).
    scheme = "rsa-pkcs1v15-sha256" if isinstance(public, rsa.RSAPublicKey) else None
    return SSlibKey.from_crypto(public, scheme=scheme)  # type: ignore[arg-type]


def load_public_key(path: str | None = None, env: Mapping[str, str] | None = None) -> SSlibKey:
    """The public key of *path* (PEM, e.g. cosign.pub), else of ``$BUILDER_VERIFY_KEY`` (PEM text).

    Example:
        >>> load_public_key("cosign.pub").keytype  # doctest: +SKIP
        'ecdsa'
    """
    env = os.environ if env is None else env
    found = _read(path, env, VERIFY_ENV, "--key")
    if found is None:
        raise UserError(f"no public key: pass --key PUB (a PEM file) or set {VERIFY_ENV} to the PEM text")
    data, where = found
    try:
        return _sslib(load_pem_public_key(data))
    except (ValueError, TypeError):
        raise UserError(f"{where}: not a PEM public key (ECDSA, Ed25519 or RSA); export it with "
                        "'cosign public-key --key KEY' or 'openssl pkey -in KEY -pubout'") from None


def _verifies(key: SSlibKey, signature_hex: str, data: bytes) -> bool:
    try:
        key.verify_signature(Signature(key.keyid, signature_hex), data)
    except (UnverifiedSignatureError, VerificationError):
        return False
    return True


def verify_blob(payload: bytes, signature_b64: str, key: SSlibKey) -> None:
    """Check a cosign signature (base64, as in the ``dev.cosignproject.cosign/signature``
    annotation) of *payload*; else :class:`BadEnvelope`."""
    try:
        sig = base64.b64decode(signature_b64, validate=True).hex()
    except (binascii.Error, ValueError):
        raise BadEnvelope("the signature is not base64") from None
    if not _verifies(key, sig, payload):
        raise BadEnvelope(f"the signature does not verify with key {key.keyid[:12]}")


def unseal(data: bytes, key: SSlibKey) -> tuple[str, bytes]:
    """(payload type, payload) of a DSSE envelope one of whose signatures *key* verifies; else
    :class:`BadEnvelope`. cosign's envelopes name no key id, so every signature is tried."""
    try:
        envelope = Envelope.from_dict(json.loads(data))
    except (ValueError, KeyError, TypeError, FormatError) as exc:
        raise BadEnvelope(f"not a DSSE envelope ({exc.__class__.__name__}: {exc})") from None
    pae = envelope.pae()
    sigs = list(envelope.signatures.values())
    if not any(_verifies(key, s.signature, pae) for s in sigs):
        raise BadEnvelope(f"no signature verifies with key {key.keyid[:12]}")
    return envelope.payload_type, envelope.payload

