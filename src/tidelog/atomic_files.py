"""Crash-safe file writes shared by both engines.

A state file is replaced whole: written to `<name>.tmp`, fsynced, renamed over the old one, and the directory
fsynced, so after a crash the file is either the old one or the new one, never torn. A `.tmp` left by a crash is
ignored by every reader and overwritten by the next write.
"""

from __future__ import annotations

import os
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (creations, renames, removals) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> bool:
    """fsync a file written earlier without it; False when it is gone (deleted meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def write_atomically(path: Path, text: str) -> None:
    """tmp + fsync + rename + directory fsync: after a crash the file is either old or new, never torn."""
    tmp = path.with_name(path.name + TEMP_SUFFIX)
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)
