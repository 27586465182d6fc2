"""filesystem_sync.sync_filesystem: one syncfs(2) of the filesystem holding a directory (Linux, as here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidelog.storage.common.filesystem_sync import sync_filesystem


def test_the_sync_runs_here_and_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "dirty").write_bytes(os.urandom(4096))
    assert sync_filesystem(tmp_path)  # Linux: syncfs exists and succeeds
    with pytest.raises(FileNotFoundError):
        sync_filesystem(tmp_path / "missing")
