"""The worker process's entry point: ``python -m lumos._private.worker.main``.

Started by its raylet; connects a ``CoreWorker`` in worker mode and runs the
``Executor`` loop on its main thread (tasks, or exactly one actor).

May import: ``core_worker``, ``transport``, ``process``, ``config``, ``worker_context``.
"""

#: Key of an actor creation task's ``actor_options`` under which the GCS hands the new
#: worker what it would otherwise fetch from the GCS before running ``__init__``:
#: ``[job config or None, pickled class or None]`` (the KV's "job" and "fn" entries).
#: Only on the copy of the spec pushed to the worker, which takes it out on arrival.
CREATION_PRELOAD = "__lumos_preload__"
