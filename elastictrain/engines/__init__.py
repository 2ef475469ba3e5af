"""Engines that carry out the scheduler's decisions: the node daemons (``launcher/node.py``, out
of process) and in-process adapters behind :mod:`.api` (Slurm), connected by :mod:`.bridge`."""
