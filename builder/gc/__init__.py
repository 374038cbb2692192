"""The clean-up: what the builder owns by its own records, and ``builder gc``.

- ``owned.py``: the images and BuildKit copies the builder's builds made or used, in ledgers per
  engine (the executor records them), and what of them may go.
- ``stores.py``: ``builder gc``: what each store holds and what no current lock or target references.

This package never imports the pipeline (:mod:`builder.images`); the pipeline records through
``owned.py`` and cleans after a build through ``stores.after_build`` (``lint-imports`` checks it).
"""
