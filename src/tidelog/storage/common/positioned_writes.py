"""Positioned writes into many files with one release of the GIL: what the RocketMQ engine's dispatcher writes in a
round, the new ConsumeQueue units of each queue it touched (one piece per queue file).

    write_pieces(pieces) -> (written, error)

Each piece is (target, position, data): `target` an open descriptor, which the caller keeps open until the call
returns, or a file's path (bytes), opened write-only for that piece and closed after it (never created: the file
exists). The pieces are written in order, each whole (a short write goes on where it stopped); the first that fails
ends the call: `written` counts the pieces written whole before it, `error` is its errno (0: every piece was
written). A failed piece may be written in part; the pieces after it are not touched.

Why: a dispatch round over thousands of queues made one pwrite each - and, past the engine's open-file budget, an
open and a close each - every one a release and a retake of the GIL, which the appending thread holds most of the
time; each retake waited for it. Compiled (_positioned_writes.c) the whole loop runs without the GIL, beside the
appends. Where the package was installed without a C compiler the same loop runs here, a system call at a time.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

Piece = tuple[int | bytes, int, bytes | bytearray | memoryview]


def write_pieces_in_python(pieces: list[Piece]) -> tuple[int, int]:
    """The contract above, one system call (and GIL release) at a time."""
    for written, (target, position, data) in enumerate(pieces):
        try:
            fd = target if isinstance(target, int) else os.open(target, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            return written, exc.errno or errno.EIO
        try:
            view = memoryview(data)
            done = 0
            while done < len(view):
                count = os.pwrite(fd, view[done:], position + done)
                if count == 0:  # no progress: what a full device may answer instead of ENOSPC
                    return written, errno.ENOSPC
                done += count
        except OSError as exc:
            return written, exc.errno or errno.EIO
        finally:
            if not isinstance(target, int):
                os.close(fd)
    return len(pieces), 0


write_pieces: Callable[[list[Piece]], tuple[int, int]]
try:
    from tidelog.storage.common._positioned_writes import write_pieces
except ImportError:  # installed without a C compiler
    write_pieces = write_pieces_in_python
