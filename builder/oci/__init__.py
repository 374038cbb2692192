"""Talking to the container world: the engines (Docker, podman) and OCI registries. Imports only :mod:`builder.config`.

- ``engine.py``: the ``Engine`` interface (a Protocol), its errors and the choice of engine by name.
- ``docker.py``, ``podman.py``: the two engines, side by side; ``docker.py`` imports docker-py (its
  ``DockerAPI`` also serves podman's Docker-compatible API), and beside it only ``dockerconfig.py``
  (``docker login``'s credentials, for the registry client).
- ``connect.py``: the engine that answers, connected, or one line saying how to get one.
- ``runflags.py``: container settings as ``docker run``'s arguments (podman's table derives from it).
- ``buildkit.py``, ``buildah.py``: a build request run by ``docker buildx build``, or by ``podman build``.
- ``registry.py``: the registry HTTP client (references, ping, credentials and auth files, manifest digests).
- ``artifacts.py``, ``recompress.py``: what the builder writes to a registry itself (manifests, blobs,
  attachments), and a pushed image's layers put in one compression.
- ``localregistry.py``: the builder's own ``docker-registry`` on loopback: started when nothing answers,
  with a login; what answers there checked before use; held by a run that pushes (``builder gc``).
- ``loopback.py``: where that registry lives (a folder per user and port) and its login.
"""
