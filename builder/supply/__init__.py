"""Supply chain: what is in an image, who built it, and the proof, attached to its digest.

:mod:`~builder.supply.sbom` (CycloneDX from the locks and base.lock.json),
:mod:`~builder.supply.provenance` (in-toto statement, SLSA provenance v1),
:mod:`~builder.supply.signing` (the user's key; cosign's signatures checked), :mod:`~builder.supply.cosign` (sign, attest),
:mod:`~builder.supply.attach` (the attachments of a pushed image) and
:mod:`~builder.supply.verify` (``builder verify``). Above the image build, below the command line.
"""
