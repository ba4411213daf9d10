"""Launchers: lumos clusters on engines that already run the machines (Slurm, Kubernetes).

- ``lumos.launch.node``: one node in the foreground (``python -m lumos.launch.node``), the
  process a Slurm step or a Kubernetes container runs; the engine owns its lifecycle.
- ``lumos.launch.slurm``: ``lumos slurm`` and ``SlurmCluster`` (a batch job per cluster).
- ``lumos.launch.kubernetes``: ``lumos kubernetes manifest|probe`` and ``KubeCluster``.

Nothing here is imported by ``import lumos``.
"""
