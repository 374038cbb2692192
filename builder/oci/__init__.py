"""Talking to the container world: the engines (Docker, podman) and OCI registries. Imports only :mod:`builder.config`.

- ``engine.py``: the ``Engine`` interface, Docker's and podman's, or one line saying how to get one.
- ``buildkit.py``, ``buildah.py``: a build request run by ``docker buildx build``, or by ``podman build``.
- ``registry.py``: the registry HTTP client (references, ping, credentials, manifest digests).
- ``localregistry.py``: Debian's ``docker-registry`` started on loopback when nothing answers.
"""
