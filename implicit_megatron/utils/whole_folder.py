"""A folder that appears under its name only once it is whole.

Exports and imports write their files into a hidden sibling and rename it when every file is there,
as checkpoint tags are written: a kill half-way leaves the hidden folder (removed by the next write),
never a folder under its final name that loads with files missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def written_whole(out: str | Path) -> Iterator[Path]:
    """Yields the folder to write into; when the block ends without error it becomes `out`. An
    existing `out` is replaced, and what it holds that the new folder does not write (an evaluation
    of an earlier export, say) is moved into the new one."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a folder; name a folder to write into")
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.partial-*"):  # left by a kill
        shutil.rmtree(stale, ignore_errors=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    partial.mkdir()
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if not out.exists():
        os.replace(partial, out)
        return
    replaced = out.parent / f".{out.name}.replaced-{os.getpid()}"
    os.replace(out, replaced)
    os.replace(partial, out)
    for entry in replaced.iterdir():
        if not (out / entry.name).exists():
            os.replace(entry, out / entry.name)
    shutil.rmtree(replaced)
