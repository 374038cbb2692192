"""Multi-node runs on an existing scheduler: ``builder slurm`` (sbatch scripts) and ``builder k8s`` (manifests).

``common.py`` holds what both share (the image reference, the launcher line, names and
variables), ``slurm.py`` the sbatch script (docker on each node, or pyxis), ``k8s.py`` the Job
(one node) or the indexed Job plus headless Service (several). The device flags come from
:mod:`builder.host.devices`, as for ``builder run``; nothing here talks to an engine.
"""
