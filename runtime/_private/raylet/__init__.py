"""The raylet process: one per node.

``server.py`` (``RayletServer``: sockets, timers, the worker pool's processes, the store
directory), ``scheduler.py`` (``LocalSchedulerState``: pure lease decisions),
``resources.py`` (resource units and ids), ``object_manager.py`` (pulls objects from
other nodes in chunks) and ``memory_monitor.py`` (kills a worker before the kernel's
OOM killer would). Run as ``python -m lumos._private.raylet.server``.

May import: ``object_store``, ``protocol``, ``transport``, ``ids``, ``config``, ``process``.
Never ``core_worker``, ``gcs`` (it talks to the GCS only through messages) or the public API.
"""
