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
    """Splits a byte stream into frames, enforcing ``max_frame_bytes``."""

    __slots__ = ("_buf", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int) -> None:
        self._buf = bytearray()
        #: Frames above this length are a protocol error; may be raised after auth.
        self.max_frame_bytes = max_frame_bytes

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return every complete frame. Raises ``ProtocolError``."""
        buf = self._buf
        if not buf and data.__class__ is bytes:
            # Nothing buffered (the usual case): slice the frames straight out of ``data``
            # (one copy each) and buffer only an incomplete tail.
            frames = []
            pos = 0
            end = len(data)
            while end - pos >= HEADER_SIZE:
                (n,) = _unpack_len(data, pos)
                if n > self.max_frame_bytes:
                    raise ProtocolError(f"frame of {n} bytes exceeds the limit of {self.max_frame_bytes}")
                start = pos + HEADER_SIZE
                if end - start < n:
                    break
                pos = start + n
                frames.append(data[start:pos])
            if pos < end:
                buf += memoryview(data)[pos:]
            return frames
        buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(buf)
        while end - pos >= HEADER_SIZE:
            (n,) = _unpack_len(buf, pos)
            if n > self.max_frame_bytes:
                raise ProtocolError(f"frame of {n} bytes exceeds the limit of {self.max_frame_bytes}")
            if end - pos - HEADER_SIZE < n:
                break
            start = pos + HEADER_SIZE
            frames.append(bytes(buf[start:start + n]))
            pos = start + n
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)
