"""Whether a folder holds only its own files: no symbolic link (which could lead a reader to files
nobody checked, or a writer to files outside the folder), no device, pipe or socket, and, for a
folder that will be written (a run folder), no hard-linked file: a file with other names elsewhere
(`cp -al` of another run) changes under all of them when a run appends to it or rewrites it in
place (metrics.jsonl, DeepSpeed's `latest`). Found without following any link."""

from __future__ import annotations

import os
from pathlib import Path

STAGING_SUFFIX = ".conversion-input"  # checkpoints.universal's hard-linked copy of a tag; removed before any use


def foreign_entry(folder: Path, hard_links: bool = False) -> str | None:
    """What in `folder` is not its own plain file or folder (None: nothing): the folder itself or
    anything below it that is a symbolic link, a device, a pipe or a socket; with `hard_links`, also
    a file that has another name (outside a conversion's staging folder, which links on purpose)."""
    if folder.is_symlink():
        return f"{folder} is a symbolic link (to {os.readlink(folder)})"
    if folder.exists() and not (folder.is_file() or folder.is_dir()):
        return f"{folder} is not a plain file or folder"
    if hard_links and folder.is_file():
        return _hard_linked(folder)
    for root, dirs, files in os.walk(folder):  # a linked folder is listed here, never entered
        for name in sorted(dirs + files):
            path = Path(root, name)
            if path.is_symlink():
                return f"{path} is a symbolic link (to {os.readlink(path)})"
            if not (path.is_file() or path.is_dir()):
                return f"{path} is not a plain file or folder"
            staged = any(part.endswith(STAGING_SUFFIX) for part in path.relative_to(folder).parts[:-1])
            linked = _hard_linked(path) if hard_links and path.is_file() and not staged else None
            if linked:
                return linked
    return None


def _hard_linked(path: Path) -> str | None:
    names = path.stat().st_nlink
    if names == 1:
        return None
    return (f"{path} is hard-linked (its data has {names} names, and writing it here would change the others: "
            "a copy made with cp -l or cp -al)")


def foreign_entry_inside(folder: Path, hard_links: bool = False) -> str | None:
    """`foreign_entry` for what `folder` holds, the folder itself aside (it may be a link: a run
    folder on another disk)."""
    if not folder.is_dir():
        return None
    for entry in sorted(folder.iterdir()):
        found = foreign_entry(entry, hard_links)
        if found:
            return found
    return None
