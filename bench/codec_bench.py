"""Micro-benchmark of the wire codec: encode + decode of the hot-path messages in one process.

``python bench/codec_bench.py`` prints microseconds per message (best of 5 ``timeit`` runs)
for a ``PushTask`` of a sync task, its ``TaskReply``, an actor call's ``PushTask``, a batch
of 100 task events, ``FrameDecoder.feed`` of one such frame and of a 1 MiB frame arriving
in 64 KiB reads, then ``serialize`` + ``to_bytes`` and ``deserialize`` of small user values
(a task's arguments and results). For an A/B, run it with a directory holding ``lumos -> <other
tree>/runtime`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import timeit

import numpy as np

from lumos._private import serialization as ser
from lumos._private.protocol import messages as m
from lumos._private.protocol.framing import FrameDecoder, frame


def _messages() -> dict[str, object]:
    node, worker, job = os.urandom(16), os.urandom(16), os.urandom(4)
    owner = m.Address(node, worker, "/tmp/lumos/sockets/worker-0123456789ab.sock", "127.0.0.1", 40123)
    spec = m.TaskSpec(os.urandom(16), job, os.urandom(16), m.TaskKind.NORMAL_TASK, "f", os.urandom(16),
                      "__main__.f", b"\x80\x05\x95\x0b" + b"x" * 40, [], [], 1, {"CPU": 1.0}, 3,
                      m.RetryPolicy.NEVER, None, owner, 0, None)
    call = m.TaskSpec(os.urandom(16), job, os.urandom(16), m.TaskKind.ACTOR_TASK, "A.f", b"",
                      "A.f", b"\x80\x05\x95\x0b" + b"x" * 40, [], [], 1, {}, 0,
                      m.RetryPolicy.NEVER, None, owner, 0, None, os.urandom(16), 7, worker)
    tid = os.urandom(16)
    reply = m.TaskReply(tid, [m.ReturnObject(tid + b"\0\0\0\1", b"\x80\x05K\x01.", 5, None, [])],
                        False, False, [], worker, 1.7e9, 1.7e9 + 1e-4)
    rows = [[os.urandom(16), 0, "FINISHED", 1.7e9, None, node, worker, None, [["RUNNING", 1.7e9]]]
            for _ in range(100)]
    return {"PushTask (task)": m.PushTask(spec, {}), "PushTask (actor call)": m.PushTask(call, {}),
            "TaskReply": reply, "AddTaskEvents x100": m.AddTaskEvents(job, rows)}


def main() -> None:
    number = 20_000
    for name, msg in _messages().items():
        data = m.encode(m.NOTIFY, 0, msg)
        assert m.decode(data)[2] == msg
        enc = min(timeit.repeat(lambda: m.encode(m.NOTIFY, 0, msg), number=number, repeat=5)) / number * 1e6
        dec = min(timeit.repeat(lambda: m.decode(data), number=number, repeat=5)) / number * 1e6
        print(f"{name:24s} {len(data):5d} B  encode {enc:6.2f} us  decode {dec:6.2f} us  total {enc + dec:6.2f} us")
    payload = frame(m.encode(m.NOTIFY, 0, _messages()["PushTask (task)"]))
    dec_ = FrameDecoder(1 << 20)
    feed = min(timeit.repeat(lambda: dec_.feed(payload), number=number, repeat=5)) / number * 1e6
    print(f"{'FrameDecoder.feed':24s} {len(payload):5d} B  {feed:6.2f} us")
    big = frame(b"x" * (1 << 20))
    chunks = [big[i:i + 65536] for i in range(0, len(big), 65536)]

    def feed_big() -> None:
        for c in chunks:
            dec_.feed(c)
    big_us = min(timeit.repeat(feed_big, number=200, repeat=5)) / 200 * 1e6
    print(f"{'FrameDecoder.feed 1 MiB':24s} in {len(chunks)} reads  {big_us:6.1f} us")
    values = {"()": (), "(1,)": (1,), "None": None, "(1, 'a', 2.5)": (1, "a", 2.5),
              "16-float array": np.arange(16, dtype=np.float64),
              "(array, 3)": (np.arange(16, dtype=np.float64), 3),
              "small dict": {"a": 1, "b": [1.0, 2.0], "c": "x"}}
    for name, value in values.items():
        blob = ser.serialize(value).to_bytes()
        enc = min(timeit.repeat(lambda: ser.serialize(value).to_bytes(), number=number, repeat=5)) / number * 1e6
        dec = min(timeit.repeat(lambda: ser.deserialize(blob), number=number, repeat=5)) / number * 1e6
        print(f"{'value ' + name:24s} {len(blob):5d} B  serialize {enc:5.2f} us  deserialize {dec:5.2f} us")


if __name__ == "__main__":
    main()
