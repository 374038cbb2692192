"""The credential-free form of a URL: what anything printed, written or published may hold.

An index or a registry may be given with its login in the URL (``https://user:token@mirror/simple``,
``--index``, ``BUILDER_INDEX_*``, pip's configuration) or a token in the query (a pre-signed
``?X-Amz-Signature=...``, ``?token=...``). Locks, the SBOM, the provenance, labels, logs and
error messages take every URL through :func:`public`; only the request itself uses the URL as given.
"""

from __future__ import annotations

import re
import urllib.parse

#: Query parameters that carry a secret: a token, key, signature, password or credential by name
#: (``access_token``, ``X-Amz-Signature``, ``X-Amz-Credential``, ``sig``, ``api_key``, ``auth``).
SECRET_PARAM = re.compile(r"token|secret|passw|pwd|sig|key|auth|credential|session", re.IGNORECASE)


def public(url: str) -> str:
    """*url* without its userinfo (``user:password@``) and without query parameters that carry a secret.

    Anything that is not a URL with a host comes back as it is (a path, a reference).

    Example:
        >>> public("https://user:tok3n@mirror.example:8443/simple/?X-Amz-Signature=ab&page=2")
        'https://mirror.example:8443/simple/?page=2'
        >>> public("file:///srv/wheels")
        'file:///srv/wheels'
        >>> public("unix:///run/docker.sock")
        'unix:///run/docker.sock'
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url if "@" not in url else url.rpartition("@")[2]
    netloc = parts.netloc.rpartition("@")[2]
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = urllib.parse.urlencode([(k, v) for k, v in pairs if not SECRET_PARAM.search(k)])
    if netloc == parts.netloc and query == parts.query:
        return url  # nothing to take out: as given (a rebuilt unix:///path would read unix:/path)
    return parts._replace(netloc=netloc, query=query).geturl()


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>()\[\]]+", re.IGNORECASE)


def redact(text: str) -> str:
    """*text* with each URL in it in its :func:`public` form (a tool's message may quote one as given).

    Example:
        >>> redact("ERROR: https://ci:tok3n@mirror.example/simple/torch/ answered 404")
        'ERROR: https://mirror.example/simple/torch/ answered 404'
    """
    return _URL.sub(lambda m: public(m.group(0)), text)
