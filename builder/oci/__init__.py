"""Talking to the container world: the Docker engine and OCI registries. Imports only :mod:`builder.config`.

- ``engine.py``: a docker-py client whose engine answered, or one line saying how to get one.
- ``registry.py``: the registry HTTP client (references, ping, credentials, manifest digests).
- ``localregistry.py``: Debian's ``docker-registry`` started on loopback when nothing answers.
"""
