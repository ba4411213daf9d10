"""Authenticated connections between lumos processes.

``connection.py`` (``Connection``: the handshake, framed msgpack RPC with ids,
notifications and server pushes, batching of writes, ``connect``/``serve`` over Unix
sockets and TCP) and ``eventloop.py`` (the event loops of lumos's own threads and
processes, uvloop when installed).

May import: ``protocol`` and ``config``. Knows connections and messages; never tasks.
"""
