"""One node's shared-memory object store: files under ``/dev/shm``, one per object.

``store_state.py`` (``ObjectStoreState``: the pure space accounting, eviction and
spilling decisions the raylet runs; its events and actions in ``store_events.py``, its
pool of free slots in ``slot_pool.py``), ``client.py`` (a process's window onto the
store: write, map read-only, view zero-copy; used by core workers from user threads),
``memcpy.py`` (the multi-threaded copy of large buffers into it) and ``spill_io.py``
(spill files on disk and their restore).

May import: the standard library, and numpy inside the functions that copy large
buffers. Knows keys and bytes; never tasks, connections or the GCS.
"""
