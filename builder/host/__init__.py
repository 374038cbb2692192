"""This host: its GPUs, the device flags a container needs here, and running images on it.

- ``hardware.py``: detection (PCI GPUs, device nodes, groups, CDI specs, the vendor to use).
- ``devices.py``: a target vendor's device flags worked out for this host: the ONE place both
  ``builder run`` and the smoke test (:mod:`builder.images.smoke`) take them from.
- ``targets.py``: which matrix target runs here (``--target auto``).
- ``runspec.py``: what ``builder run`` will do (image, command, env, user, devices), no engine needed;
  ``launch.py``: running the plan (pull, stream, signals, cleanup).
- ``doctor.py``: ``builder doctor``'s checks.

A new backend needs its detection in ``hardware.py`` and its flags in ``devices.py`` (after
``wheel-mapping.json``'s ``run`` entry and ``templates/backends/``). This package may use the
registry client (:mod:`builder.oci`) but never the image build (:mod:`builder.images`).
"""
