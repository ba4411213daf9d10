"""The core worker: the engine inside every driver and worker process.

Owns what one process owns in a cluster: the objects it created (status, inline values,
locations, reference counts and borrowers, lineage to rebuild them), its task
submission (scheduling queues per resource shape, worker leases, pipelined pushes,
retries), its actor calls (``actor_submitter.py``; ``actor_host.py`` on the actor's
side) and, in a worker, the execution of pushed tasks (``executor.py``). It runs an
asyncio loop in the ``lumos-io`` thread (``io_loop.py``); user threads hand it work
through an inbox. Decisions are pure states: ``owner.py`` ``OwnerState`` (objects,
arguments, lineage, reconstruction) and ``task_submitter.py`` ``TaskSubmitterState``
(queues, leases, pipelining, retries); ``core_worker.py`` wires connections to them and
carries out their actions (its docstring maps every module).

May import: ``protocol``, ``transport``, ``object_store`` (the client), ``serialization``,
``ids``, ``config``, ``working_dir``, constants of ``gcs``/``raylet``, and the public
value types ``lumos.exceptions``, ``lumos.object_ref``, ``lumos.generator``. Imported by
the API modules, ``worker_context`` and ``worker``; by ``gcs`` and ``raylet`` only for
``io_loop.spawn`` (the one tracked-background-task helper, which imports nothing of the
core worker).
"""
