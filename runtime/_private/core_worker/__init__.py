"""The core worker: the engine inside every driver and worker process.

Owns what one process owns in a cluster: the objects it created (status, inline values,
locations, reference counts and borrowers, lineage to rebuild them), its task
submission (scheduling queues per resource shape, worker leases, pipelined pushes,
retries), its actor calls (``actor_submitter.py``; ``actor_host.py`` on the actor's
side) and, in a worker, the execution of pushed tasks (``executor.py``). It runs an
asyncio loop in the ``lumos-io`` thread; user threads hand it work through an inbox.

May import: ``protocol``, ``transport``, ``object_store`` (the client), ``serialization``,
``ids``, ``config``, ``working_dir``, constants of ``gcs``/``raylet``, and the public
value types ``lumos.exceptions``, ``lumos.object_ref``, ``lumos.generator``. Imported by
the API modules, ``worker_context`` and ``worker``; never by ``gcs`` or ``raylet``.
"""
