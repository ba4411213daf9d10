"""Frames, authentication and message types of the lumos wire protocol.

``framing.py`` (length-prefixed frames, ``ProtocolError``), ``auth.py`` (the two-way
HMAC handshake, tokens), ``codec.py`` (the message registry and the msgpack codec),
``vocab.py`` (the wire enums: ``TaskKind``, ``RetryPolicy``, ``ErrorKind``, ``ObjectState``,
``TaskState``), the message classes by area (``task_messages.py``, ``gcs_messages.py``,
``raylet_messages.py``, ``cluster_messages.py``), ``messages.py`` (all of them under
one name: ``from lumos._private.protocol import messages as m``) and ``task_row.py``
(the one task-row schema of the GCS task log, ``lumos.state`` and the dashboard).
Knows bytes, message classes and their field vocabularies; never runs tasks or holds
objects.

May import: the standard library, msgpack and ``lumos._private.ids`` only (every other
package imports it).
"""
