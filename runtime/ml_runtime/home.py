"""A writable ``HOME`` for whatever UID the container runs as.

``docker run -u 4242:4242`` (or Kubernetes' ``runAsUser``, or ``builder run`` as the host
user) starts a UID with no passwd entry, and the engine sets ``HOME=/``, which it cannot
write: the Hugging Face, torch and pip caches under ``~/.cache`` then fail. The image stays
as it is (nothing world-writable is added); instead the entrypoint gives such a UID a
private home under the temporary directory, for the command alone.
"""

from __future__ import annotations

import os
import tempfile


def private_home(home: str | None = None, tmp: str | None = None, uid: int | None = None) -> str | None:
    """A HOME to set when the current one is missing or not writable; None when it is fine.

    The folder is ``<tmp>/home-<uid>``, mode 0700, and must belong to the UID (else a fresh
    ``mkdtemp`` folder is used), so no other user can plant files in it.

    Example:
        >>> import tempfile
        >>> private_home(home="/nonexistent", tmp=tempfile.mkdtemp())  # doctest: +ELLIPSIS
        '/tmp/.../home-...'
        >>> private_home(home=tempfile.mkdtemp()) is None
        True
    """
    home = os.environ.get("HOME") if home is None else home
    uid = os.getuid() if uid is None else uid
    if home and os.path.isdir(home) and os.access(home, os.W_OK | os.X_OK):
        return None
    tmp = tmp or tempfile.gettempdir()
    path = os.path.join(tmp, f"home-{uid}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return tempfile.mkdtemp(prefix=f"home-{uid}-", dir=tmp)
    info = os.lstat(path)
    if info.st_uid != uid or not os.path.isdir(path) or os.path.islink(path):
        return tempfile.mkdtemp(prefix=f"home-{uid}-", dir=tmp)
    return path
