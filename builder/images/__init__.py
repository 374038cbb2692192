"""Making the images: render, lint, lock, base, build, smoke-test, publish, bake.

- ``render.py`` (``templates/`` -> ``images/<target>/Dockerfile``), ``lint.py`` (hadolint).
- Locks: ``locks.py`` (``builder lock``: reuse or re-resolve each lock), ``lockfile.py`` (the
  lock format), ``resolve.py`` (pip on the host for the image's platform, index probes),
  ``wheelhouse.py`` (where wheels live, its ledger of which the builder fetched and verified,
  and the per-layer folders a build mounts as its named contexts ``wheels-<layer>``).
- ``base.py``: the reproducible, pinned base (mmdebstrap).
- ``plan.py`` (per target view: content tag, references, build request and the ordered
  stages; the pure reuse decision), ``execute.py`` (the executor: build -> smoke -> tag ->
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
