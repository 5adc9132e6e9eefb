"""The ``raftwal`` command line (``raftwal.cli.main``), one module per group of commands
(``client``: coordination and data commands; ``spark``: Spark reads), the local dev cluster
(``dev``, ``devcerts``) and the scripted demo (``demo``).

It may import every other part of raftwal; nothing imports it but ``raftwal.chaos``, which
uses the dev-cluster helpers.
"""
