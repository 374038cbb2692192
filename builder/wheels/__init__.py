"""The wheels: resolving, locking, fetching and staging what ``pip install`` puts in each layer.

- ``locks.py`` (``builder lock``: reuse or re-resolve each lock), ``lockfile.py`` (the lock format),
  ``resolve.py`` (pip on the host for the image's platform, index probes).
- ``wheelhouse.py``: where wheels live, its ledger of which the builder fetched and verified;
  ``contexts.py``: the per-layer folders a build mounts as its named contexts ``wheels-<layer>``;
  ``images.py``: those folders as images of the engine's store, where its builds read them in place.
- ``layers.py``: the layer plan (which locked wheel goes into which layer of the image).

This package never imports the pipeline (:mod:`builder.images`), the base or the clean-up
(``lint-imports`` checks it): the pipeline and ``builder gc`` use it.
"""
