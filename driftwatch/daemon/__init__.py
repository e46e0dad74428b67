"""``driftwatch daemon``, the node agent: one process watching every hooked process and
every ``--match`` of a node.

- ``driftwatch.daemon.config``: its TOML configuration and command-line options;
- ``driftwatch.daemon.discovery``: how it finds the processes to watch;
- ``driftwatch.daemon.agent``: the ``Daemon`` loop that watches them.
"""
