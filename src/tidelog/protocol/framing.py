"""Kafka's framing: every request and response is `size int32 | payload`, big-endian, size excluding itself.

A size below the smallest possible request header or above `socket.request.max.bytes` is a protocol
violation: the connection is closed (Kafka's InvalidReceiveException), nothing else is affected.
"""

from __future__ import annotations

import struct

from tidelog.errors import FrameError

SIZE = struct.Struct(">i")
MIN_REQUEST_SIZE = 8  # api key, api version, correlation id


def check_frame_size(size: int, max_frame_bytes: int) -> None:
    if size < MIN_REQUEST_SIZE:
        raise FrameError(f"frame of {size} bytes is smaller than any request header")
    if size > max_frame_bytes:
        raise FrameError(f"frame of {size} bytes exceeds socket.request.max.bytes ({max_frame_bytes})")


def frame(payload: bytes) -> bytes:
    return SIZE.pack(len(payload)) + payload
