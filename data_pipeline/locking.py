"""An exclusive advisory file lock, so that concurrent builders of the same files take turns.

Several launcher ranks may call `ensure_shards` at once, and several ranks may build the same
sample-index cache: the first one in does the work, the others wait and then find it done.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def exclusive_lock(path: str) -> Iterator[None]:
    """Hold an flock on `path` (created when missing, never through a link) for the duration of the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
