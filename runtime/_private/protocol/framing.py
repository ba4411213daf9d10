"""Length-prefixed frames.

A frame is a 4-byte little-endian length followed by that many bytes. The decoder
checks every length against a maximum before it waits for (or allocates) the body,
so a peer cannot make us buffer more than that maximum.
"""

from __future__ import annotations

import struct

HEADER = struct.Struct("<I")
HEADER_SIZE = HEADER.size
_pack_len = HEADER.pack
_unpack_len = HEADER.unpack_from


class ProtocolError(Exception):
    """A peer sent something we cannot accept. The connection is closed; nothing else."""


def frame(payload: bytes) -> bytes:
    return _pack_len(len(payload)) + payload


class FrameDecoder:
    """Splits a byte stream into frames, enforcing ``max_frame_bytes``.

    Bytes of an incomplete frame are kept as the pieces they came in and joined once, when
    the frame is complete: a large frame costs one copy, not one per read."""

    __slots__ = ("_parts", "_have", "_need", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int) -> None:
        #: Received bytes not yet framed (the first holds the next frame's start).
        self._parts: list[bytes | memoryview] = []
        self._have = 0
        #: Length of the next frame with its header once its header is here, else 0.
        self._need = 0
        #: Frames above this length are a protocol error; may be raised after auth.
        self.max_frame_bytes = max_frame_bytes

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return every complete frame. Raises ``ProtocolError``."""
        parts = self._parts
        if not parts:
            return self._split(data)
        if not data:
            return []
        parts.append(bytes(data) if data.__class__ is not bytes else data)
        self._have += len(data)
        need = self._need
        if need == 0:  # the header was incomplete
            if self._have < HEADER_SIZE:
                return []
            self._parts, self._have = [], 0
            return self._split(b"".join(parts))
        extra = self._have - need
        if extra < 0:
            return []
        self._parts, self._have, self._need = [], 0, 0
        # The frame is the pieces without the header (in the first) and without what
        # follows it (in the last); memoryviews leave the joining as the only copy.
        last = parts[-1]
        rest = b""
        if extra:
            parts[-1] = memoryview(last)[:len(last) - extra]
            rest = bytes(memoryview(last)[len(last) - extra:])
        parts[0] = memoryview(parts[0])[HEADER_SIZE:]
        frames = [b"".join(parts)]
        if rest:
            frames += self._split(rest)
        return frames

    def _split(self, data: bytes) -> list[bytes]:
        """Frames of ``data`` with nothing buffered before it; keeps an incomplete tail."""
        if data.__class__ is not bytes:
            data = bytes(data)
        frames: list[bytes] = []
        pos = 0
        end = len(data)
        while end - pos >= HEADER_SIZE:
            (n,) = _unpack_len(data, pos)
            if n > self.max_frame_bytes:
                raise ProtocolError(f"frame of {n} bytes exceeds the limit of {self.max_frame_bytes}")
            start = pos + HEADER_SIZE
            if end - start < n:
                self._need = HEADER_SIZE + n
                break
            pos = start + n
            frames.append(data[start:pos])
        if pos < end:
            self._parts = [data[pos:] if pos else data]
            self._have = end - pos
        return frames

    @property
    def buffered_bytes(self) -> int:
        return self._have
