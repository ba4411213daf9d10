"""Frames, authentication and message types of the lumos wire protocol.

``framing.py`` (length-prefixed frames, ``ProtocolError``), ``auth.py`` (the two-way
HMAC handshake, tokens) and ``messages.py`` (every message class, its wire number and
the msgpack codec). Knows bytes and message classes; never tasks or objects.

May import: the standard library and msgpack only (every other package imports it).
"""
