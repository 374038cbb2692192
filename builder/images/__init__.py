"""The pipeline: render, lint, build, smoke-test, publish, bake.

The rooms beside it: the wheels (:mod:`builder.wheels`), the base (:mod:`builder.base`) and the
clean-up (:mod:`builder.gc`).

- ``render.py`` (``templates/`` -> ``images/<target>/Dockerfile``), ``lint.py`` (hadolint).
- ``content.py``: content tags and build arguments.
- ``plan.py`` (per target view: content tag, references, build request and the ordered
  stages; the pure reuse decision), ``lookup.py`` (what is already there: the answers the decision
  takes), ``execute.py`` (the executor: build -> smoke -> tag ->
  push -> attest -> record per view, on :class:`builder.oci.engine.Engine`; the build itself
  runs through BuildKit, :mod:`builder.oci.buildkit`), ``build.py`` (``builder build`` and
  ``builder push``, one pipeline: pin the base, plan once, look up, decide, fetch, execute, indexes), ``outcome.py`` (a view's result),
  ``progress.py`` (the progress view), ``smoke.py`` (checks in the built image),
  ``publish.py`` (push, digests, ``dist/published.json``), ``bake.py`` (``docker-bake.json``),
  ``trust.py`` (what a registry holds counts as smoke-tested only by a digest the builder recorded,
  or a signature by a configured key).

A new check of a built image goes into ``smoke.py`` when the host drives it, or into the
in-image runtime (``runtime/ml_runtime``) when the image should check itself; a new backend
needs a template in ``templates/backends/`` (see :mod:`builder.host` for its device flags).
Smoke tests take their device flags from :mod:`builder.host.devices`.
"""
