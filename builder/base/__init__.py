"""The base: the reproducible, pinned image every target starts from (mmdebstrap, or a pinned ``image:``).

- ``pin.py``: ``get``, the one way to the base (``builder base``, and ``builder build`` before planning
  and before each build): taken as it is, pulled, copied to a new registry, or bootstrapped and
  pushed, and pinned in ``base.lock.json`` (:mod:`builder.config.baselock`, the file's format);
  ``check`` (``builder base --check``).
- ``bootstrap.py``: making it from Debian (mmdebstrap, its reproducible image config and archive),
  with no engine or registry; ``blobs.py``: its bytes between the engine and the registry (pushed
  from its own bytes, copied between registries, saved, loaded).

This package never imports the pipeline (:mod:`builder.images`), the wheels or the clean-up
(``lint-imports`` checks it): the pipeline and ``builder base`` use it.
"""
