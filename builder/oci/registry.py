"""The OCI registry HTTP client: references, ping, credentials, manifest digests.

Credentials come only from the builder's loopback registry (its own login, for its own port:
:mod:`builder.oci.loopback`), the environment (``BUILDER_REGISTRY_USER`` and
``BUILDER_REGISTRY_PASSWORD``) or the Docker config (``docker login``); they are never printed or
written anywhere. The environment's are the matrix registry's (:func:`use_for`): no other host gets
them (the base's upstream, ``builder run``'s and ``builder verify``'s references, an old registry),
while ``docker login`` credentials are per host already. A token service (the realm a registry
names) gets them only over https, or http on loopback.

The requests are made by ``requests``: the ``Authorization`` header goes to the registry's own origin
(scheme, host and port) alone, never with a request to a URL it names elsewhere (an upload location),
and requests drops it on a redirect to another host, port or scheme (``should_strip_auth``): an S3 or
CDN blob store a registry redirects a blob download to gets no login. TLS is checked against the
system's CA bundle (OpenSSL's, ``SSL_CERT_FILE``), not certifi's: a private CA installed on the host
is trusted, as the engine trusts it.

Child processes get :func:`builder.oci.secrets.child_env` of their tool: never these credentials.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import ssl
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from builder.config.errors import UserError
from builder.config.urls import public
from builder.oci import dockerconfig, loopback
from builder.oci.secrets import PASSWORD_ENV, USER_ENV

MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.oci.image.index.v1+json"
)


class RegistryFault(Exception):
    """A registry failed in a way no config change fixes at once (token endpoint down, login expired);
    :func:`builder.oci.faults.describe` makes it one line and exit code 4."""


@dataclass(frozen=True)
class Ref:
    """A parsed image reference: host, repository path and tag or digest."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, ref: str) -> Ref:
        """Split an image reference.

        Example:
            >>> Ref.parse("localhost:5000/ml-runtime:cpu")
            Ref(host='localhost:5000', repository='ml-runtime', tag='cpu', digest=None)
        """
        name, _, digest = ref.partition("@")
        tag = None
        if ":" in name.rsplit("/", 1)[-1]:
            name, tag = name.rsplit(":", 1)
        host, _, repo = name.partition("/")
        return cls(host, repo, tag, digest or None)

    @property
    def name(self) -> str:
        return f"{self.host}/{self.repository}"


def is_local(host: str) -> bool:
    """Registries on loopback speak plain HTTP (Docker trusts 127.0.0.0/8 without TLS too)."""
    return re.fullmatch(r"(localhost|127\.\d+\.\d+\.\d+|\[::1\])(:\d+)?", host) is not None


def _base_url(host: str) -> str:
    return f"{'http' if is_local(host) else 'https'}://{host}"


#: The host the environment's credentials are for: the matrix registry's, once a project is loaded.
_matrix_host: str | None = None


def use_for(registry: str) -> None:
    """Give BUILDER_REGISTRY_USER/PASSWORD to *registry*'s host (``host[:port]/repository``) alone."""
    global _matrix_host
    _matrix_host = Ref.parse(registry).host if "/" in registry else registry


def credentials(host: str) -> dict[str, str] | None:
    """Credentials for *host*: the login of the builder's registry on that loopback port
    (:func:`builder.oci.loopback.login`), else the environment's when *host* is the matrix registry's
    (:func:`use_for`), else the Docker config's for *host*, else None."""
    if is_local(host) and (own := loopback.login(host)) is not None:
        return own
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if user and password and host == _matrix_host:
        return {"username": user, "password": password}
    return dockerconfig.login(host)


@contextlib.contextmanager
def authfile(host: str | None, creds: dict[str, str] | None) -> Iterator[str | None]:
    """A private auth file naming *creds* for *host* (never an argument), removed afterwards; None without
    creds: how a CLI (podman, buildah) gets a login."""
    if not host or not creds:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="builder-auth-") as tmp:
        path = Path(tmp) / "auth.json"
        path.touch(mode=0o600)
        token = base64.b64encode(f"{creds['username']}:{creds['password']}".encode()).decode()
        path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
        yield str(path)


def push_refused(host: str, error: str, login: str = "docker login") -> str:
    """One line for a push *host* refused (the engine's *error*), with the fix; *login* is the engine's command.

    Example:
        >>> push_refused("r.example", "unauthorized: authentication required", "podman login")
        "registry r.example refused the push (unauthorized: authentication required); log in with 'podman login r.example' or set BUILDER_REGISTRY_USER and BUILDER_REGISTRY_PASSWORD"
    """
    text = (error.strip().splitlines() or ["?"])[0][:200]
    lowered = text.lower()
    if any(word in lowered for word in ("unauthorized", "authentication required", "denied", "no basic auth")):
        return (
            f"registry {host} refused the push ({text}); log in with '{login} {host}' "
            f"or set {USER_ENV} and {PASSWORD_ENV}"
        )
    if "connection refused" in lowered or "no such host" in lowered or "dial tcp" in lowered:
        return f"registry {host} is unreachable ({text}); start it or fix 'registry' in matrix.yaml"
    return f"push to {host} failed: {text}"


class _Auth(requests.auth.AuthBase):
    """The ``Authorization`` of one request (none when *value* is None: no ``~/.netrc`` login either, as
    a registry's login comes from the Docker config or the environment alone). requests applies it to
    the first request only; on a redirect it drops it where the host, port or scheme changes."""

    def __init__(self, value: str | None) -> None:
        self.value = value

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        if self.value:
            request.headers["Authorization"] = self.value
        return request


def ca_bundle() -> str | bool:
    """The CA bundle OpenSSL uses here (``SSL_CERT_FILE``, else the system's), as the engine and
    urllib trust; requests' own default is certifi's, which lacks a private CA installed on the host."""
    paths = ssl.get_default_verify_paths()
    return paths.cafile or paths.capath or True


def fetch(method: str, url: str, auth: str | None = None, headers: dict[str, str] | None = None,
          data: bytes | None = None, timeout: float = 10, ca: str | None = None) -> requests.Response:
    """One HTTP request, redirects followed, TLS checked against *ca* (else :func:`ca_bundle`); *auth*
    (an ``Authorization`` value) never beyond *url*'s origin: the builder's one HTTP client (the
    registries, their token services, an index's probe)."""
    return requests.request(method, url, headers=headers, data=data, auth=_Auth(auth), timeout=timeout,
                            verify=ca or ca_bundle())


def cause(exc: BaseException) -> str:
    """What the innermost OS error under *exc* says ("Connection refused", "Name or service not known",
    a certificate's fault), else *exc*'s first line: requests wraps it in two more, each naming objects.

    Example:
        >>> try:
        ...     fetch("GET", "http://127.0.0.1:9/v2/", timeout=2)
        ... except requests.RequestException as exc:
        ...     cause(exc)
        'Connection refused'
    """
    said, seen = (str(exc).splitlines() or [type(exc).__name__])[0], exc
    for _ in range(10):  # a chain is short; a cycle is possible
        if isinstance(seen, OSError) and seen.strerror:
            said = str(seen.strerror)
        if (inner := seen.__cause__ or seen.__context__) is None:
            break
        seen = inner
    return said


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of *url*, the port as the scheme implies where none is written.

    Example:
        >>> _origin("https://Registry.example:443/v2/") == _origin("https://registry.example/v2/x")
        True
    """
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # not a port: an origin of its own, that nothing matches
        return parts.scheme, parts.netloc, -1
    return parts.scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(parts.scheme)


def ping(host: str, timeout: float = 3.0) -> bool:
    """True if a registry answers /v2/ on *host* (401 counts: it is up and wants credentials)."""
    try:
        status = fetch("GET", f"{_base_url(host)}/v2/", timeout=timeout).status_code
    except (requests.RequestException, OSError):
        return False
    return status < 400 or status == 401


def accepts(host: str, creds: dict[str, str] | None) -> bool:
    """Whether the registry on *host* answers ``/v2/`` with 200 to *creds* (None: to a request without any);
    a :class:`RegistryFault` when its token service fails."""
    try:
        status, _, _ = _request("GET", f"{_base_url(host)}/v2/", host, creds, {})
    except UserError:
        return False
    return status == 200


def token_realm(host: str, realm: str) -> str:
    """*realm* (the token service a registry on *host* names) when credentials may go there: https,
    or http on loopback; else a :class:`RegistryFault` (nothing is sent).

    Example:
        >>> token_realm("registry.example", "https://auth.example/token")
        'https://auth.example/token'
        >>> token_realm("registry.example", "http://auth.example/token")
        Traceback (most recent call last):
        builder.oci.registry.RegistryFault: registry registry.example names the token service http://auth.example/token: ...
    """
    parts = urllib.parse.urlsplit(realm)
    if parts.scheme == "https" and parts.hostname or parts.scheme == "http" and is_local(parts.netloc):
        return realm
    raise RegistryFault(f"registry {host} names the token service {public(realm)}: credentials go only to an "
                        "https token service (or http on loopback); fix the registry's auth configuration")


def _bearer(host: str, challenge: str, creds: dict[str, str] | None) -> str | None:
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if "realm" not in params:
        return None
    query = "&".join(f"{k}={v}" for k, v in params.items() if k in ("service", "scope"))
    resp = fetch("GET", f"{token_realm(host, params['realm'])}?{query}", f"Basic {_basic(creds)}" if creds else None)
    if resp.status_code >= 400:
        fix = ("log in again (docker login, or BUILDER_REGISTRY_USER/BUILDER_REGISTRY_PASSWORD): the login "
               "is wrong or expired") if resp.status_code in (401, 403) else "retry later, or check the token service"
        raise RegistryFault(f"registry {host}: its token endpoint {public(resp.url)} answered HTTP {resp.status_code}; "
                            f"{fix}")
    body = resp.json()
    return body.get("token") or body.get("access_token")


def _token(host: str, challenge: str, creds: dict[str, str] | None) -> str | None:
    """:func:`_bearer`, its failures as one line naming the registry and its token endpoint."""
    try:
        return _bearer(host, challenge, creds)
    except (requests.RequestException, OSError, ValueError) as exc:  # ValueError: a body that is no JSON
        raise RegistryFault(f"registry {host}: its token endpoint is unreachable or answered no token "
                            f"({public(cause(exc))[:200]}); retry, or check the registry's auth service") from None


def _basic(creds: dict[str, str]) -> str:
    return base64.b64encode(f"{creds['username']}:{creds['password']}".encode()).decode()


def _request(
    method: str, url: str, host: str, creds: dict[str, str] | None, headers: dict[str, str], data: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One registry API call with Basic, then Bearer (token) auth; (status, headers, body). 404 -> (404, {}, b"").

    The login goes only to the registry's own origin (:func:`fetch`): a *url* the registry named elsewhere
    (an upload location on another host) is asked without it.
    """
    mine = _origin(url) == _origin(_base_url(host))
    auth = f"Basic {_basic(creds)}" if creds and mine else None
    for _ in range(2):
        try:
            resp = fetch(method, url, auth, headers, data)
            body = resp.content
        except (requests.RequestException, OSError) as exc:
            raise UserError(f"registry {host} is unreachable ({public(cause(exc))[:200]}); start it or fix 'registry' "
                            "in matrix.yaml") from None
        if resp.status_code < 400:
            return resp.status_code, dict(resp.headers.items()), body
        if resp.status_code == 404:
            return 404, {}, b""
        challenge = resp.headers.get("WWW-Authenticate", "")
        if (resp.status_code == 401 and mine and challenge.lower().startswith("bearer")
                and not (auth or "").startswith("Bearer")):
            token = _token(host, challenge, creds)
            auth = f"Bearer {token}" if token else auth
            continue
        raise UserError(f"registry {host} answered {resp.status_code} for {url.split('/v2/', 1)[-1]}: check "
                        "credentials (docker login, or BUILDER_REGISTRY_USER/BUILDER_REGISTRY_PASSWORD) and access")
    raise UserError(f"registry {host} refused the token it issued for {url}")


def manifest_digest(ref: str, creds: dict[str, str] | None = None) -> str | None:
    """The digest the registry reports for a tag or digest reference, or None if it has none."""
    r = Ref.parse(ref)
    url = f"{_base_url(r.host)}/v2/{r.repository}/manifests/{r.digest or r.tag or 'latest'}"
    status, headers, _ = _request("HEAD", url, r.host, creds, {"Accept": MANIFEST_TYPES})
    return None if status == 404 else headers.get("Docker-Content-Digest")


def copy_tag(source: str, tag: str, creds: dict[str, str] | None = None) -> str:
    """Point *tag* at the manifest *source* names, in the same repository, without pulling; return its digest.

    The manifest is fetched and put back byte for byte, so the digest stays the same.
    """
    r = Ref.parse(source)
    base = f"{_base_url(r.host)}/v2/{r.repository}/manifests"
    status, headers, body = _request("GET", f"{base}/{r.digest or r.tag}", r.host, creds, {"Accept": MANIFEST_TYPES})
    if status == 404:
        raise UserError(f"registry {r.host} has no {source}")
    media = headers.get("Content-Type", "application/vnd.docker.distribution.manifest.v2+json")
    _request("PUT", f"{base}/{tag}", r.host, creds, {"Content-Type": media}, body)
    return "sha256:" + hashlib.sha256(body).hexdigest()


INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


def put_index(ref: str, images: list[tuple[str, str]], creds: dict[str, str] | None = None) -> str:
    """Put one OCI image index under *ref*'s tag listing each ``(platform, digest)`` image of its
    repository; return the index digest (the registry's, checked against ours).

    Each entry carries the image manifest's own media type and size, read from the registry. The
    JSON is written canonically (sorted keys, no spaces), so the same images give the same digest.

    Example:
        >>> put_index("localhost:5000/ml-runtime:nvidia-cu130", [("linux/amd64", "sha256:..."), ...])  # doctest: +SKIP
        'sha256:...'
    """
    r = Ref.parse(ref)
    base = f"{_base_url(r.host)}/v2/{r.repository}/manifests"
    entries = []
    for platform, digest in images:
        status, headers, body = _request("GET", f"{base}/{digest}", r.host, creds, {"Accept": MANIFEST_TYPES})
        if status == 404:
            raise UserError(f"registry {r.host} has no {r.name}@{digest} ({platform}) to list in the index {ref}")
        os_name, arch = platform.split("/", 1)
        entries.append({"mediaType": headers.get("Content-Type", "").split(";")[0], "digest": digest,
                        "size": len(body), "platform": {"architecture": arch, "os": os_name}})
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": entries},
                       sort_keys=True, separators=(",", ":")).encode()
    _request("PUT", f"{base}/{r.tag}", r.host, creds, {"Content-Type": INDEX_TYPE}, index)
    digest = "sha256:" + hashlib.sha256(index).hexdigest()
    reported = manifest_digest(ref, creds)
    if reported != digest:
        raise UserError(f"registry {r.host} reports {reported} for the index {ref}, which was written as {digest}")
    return digest
