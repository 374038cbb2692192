"""Talking to the container world: the engines (Docker, podman) and OCI registries. Imports only :mod:`builder.config`.

- ``engine.py``: the ``Engine`` interface, Docker's and podman's, or one line saying how to get one.
- ``buildkit.py``, ``buildah.py``: a build request run by ``docker buildx build``, or by ``podman build``.
- ``registry.py``: the registry HTTP client (references, ping, credentials, manifest digests).
- ``localregistry.py``: the builder's own ``docker-registry`` on loopback: started when nothing answers,
  with a login; what answers there checked before use; held by a run that pushes (``builder gc``).
- ``loopback.py``: where that registry lives (a folder per user and port) and its login.
"""
