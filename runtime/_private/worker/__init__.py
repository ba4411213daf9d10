"""The worker process's entry point: ``python -m lumos._private.worker.main``.

Started by its raylet; connects a ``CoreWorker`` in worker mode and runs the
``Executor`` loop on its main thread (tasks, or exactly one actor).

May import: ``core_worker``, ``transport``, ``process``, ``config``, ``worker_context``.
"""
