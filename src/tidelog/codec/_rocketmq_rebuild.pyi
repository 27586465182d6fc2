# The compiled rebuild (_rocketmq_rebuild.c; the contract is in codec/rocketmq_batches.py).
from collections.abc import Callable

from numpy import ndarray

def configure(
    names: tuple[bytes, ...], roles: tuple[int, ...], crc: Callable[[memoryview], int], properties_width: int
) -> None: ...
def rebuild(
    data: ndarray,
    positions: ndarray,
    sizes: ndarray,
    first_offset: int,
    max_bytes: int,
    min_one_message: bool,
    at_end: bool,
) -> tuple[bytes | None, int, int, bool] | None: ...
