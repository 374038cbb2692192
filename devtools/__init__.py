"""Development tools shared by the tests (``tests/``) and the benchmark (``bench/``).

Neither the builder nor the in-image runtime imports this package, and it imports neither of
them (``lint-imports`` checks both): it is the one place for what the tests and the benchmark
both need, so that ``bench/`` never depends on ``tests/``. See :mod:`devtools.support`, and
:mod:`devtools.locks` (the lock files, as a user's script reads them).
"""
