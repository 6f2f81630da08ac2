"""A folder that appears under its name only once it is whole.

Exports and imports write their files into a hidden sibling and rename it when every file is there,
as checkpoint tags are written: a kill half-way leaves the hidden folder (removed by the next write),
never a folder under its final name that loads with files missing. Writing over an earlier folder
keeps what it holds that the new one does not write (an evaluation of an earlier export, say): those
entries are linked into the new folder before the two are swapped, so a kill at any moment leaves
the old folder whole or the new one whole, each with them; between the two renames of the swap the
old one waits under a hidden name, and the next write puts it back first.
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
    existing `out` is replaced, and what it holds that the new folder does not write is kept."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a folder; name a folder to write into")
    out.parent.mkdir(parents=True, exist_ok=True)
    recover(out)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    partial.mkdir()
    try:
        yield partial
        if out.exists():
            for entry in sorted(out.iterdir()):
                if not (partial / entry.name).exists():
                    _link_copy(entry, partial / entry.name)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if not out.exists():
        os.replace(partial, out)
        return
    replaced = out.parent / f".{out.name}.replaced-{os.getpid()}"
    os.replace(out, replaced)
    os.replace(partial, out)
    shutil.rmtree(replaced)


def recover(out: Path) -> None:
    """Undo what a kill during an earlier write left beside `out`: its unfinished folder is removed,
    and an old folder caught between the two renames of a swap is put back under its name (a newer
    one already there holds everything it held: see written_whole)."""
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for old in sorted(out.parent.glob(f".{out.name}.replaced-*")):
        if out.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, out)


def _link_copy(source: Path, target: Path) -> None:
    """`source` (a file or a folder) at `target` as hard links (copies where links are not possible):
    no data is copied, and removing the source later leaves the target whole."""
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, target, copy_function=link, symlinks=True)
    else:
        link(str(source), str(target))
