"""The bottom layer: what the project says, read and checked, with no engine, network or host in sight.

- ``matrix.py``: ``matrix.yaml``'s models (every key documented where it is declared);
  ``wheelmap.py``: ``wheel-mapping.json``'s (index, local suffix, torch releases, run flags);
  ``grammar.py``: the names, versions and URLs both accept.
- ``loaders.py`` (YAML/JSON with file:line errors), ``validation.py`` (one line per problem),
  ``errors.py`` (``UserError``: exit 2 with a fix; ``TargetFailed``: one target failed).
- ``project.py``: the resolution: matrix + wheel mapping + base pin -> ``Target``\\ s (tags, labels,
  torch pin, index, device flags), and their ``TargetView``\\ s, one per platform (lock, arch, local tags);
  ``baselock.py``: ``base.lock.json``; ``tags.py``: the tag scheme (every name the builder gives an image).
- ``files.py``: atomic writes, lock files; ``heartbeat.py``: a line while a long step is silent; ``state.py``: the user's state folder (wheelhouse, local
  registry, leases and ledgers); ``ownership.py``: what the builder owns, by its own records: each run's lease (a lock held for the
  process's life) and the ledgers of what it made or fetched, which every clean-up reads.

A new matrix key goes into ``matrix.py`` (and, if it changes a target, ``project.py``); a new
backend starts in ``wheel-mapping.json`` (``wheelmap.py`` says what an entry may hold).
This package imports nothing else of the project (``lint-imports`` checks it).
"""
