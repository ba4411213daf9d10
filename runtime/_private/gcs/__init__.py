"""The Global Control Store process: the cluster's control state.

``server.py`` (``GcsServer``: node, job, worker and KV tables, pub/sub, heartbeats),
``actor_manager.py`` (actor lifecycle and restarts; its decisions in the pure
``actor_state.py``), ``placement_groups.py`` (bundles on nodes; the pure part, with the
two-phase reservation, in ``placement_group_state.py``), ``raylet_pool.py`` (the GCS's one
connection per raylet), ``global_scheduler.py`` (picks a node for a lease a raylet spilled), ``task_log.py``
(the task-event log the state API and dashboard read), ``storage/`` (where the tables
live: memory or Redis), and ``client.py`` (a GCS connection for processes outside a
job, behind ``lumos.state.StateClient``). Run as ``python -m lumos._private.gcs.server``.

May import: ``gcs.storage``, ``protocol``, ``transport``, ``ids``, ``config``, ``process``
and ``raylet.resources`` (resource units). Never ``core_worker`` or the public API.
"""
