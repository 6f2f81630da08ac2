"""Whether a folder holds only its own files: no symbolic link (which could lead a reader to files
nobody checked, or a writer to files outside the folder), no device, pipe or socket. Found without
following any link."""

from __future__ import annotations

import os
from pathlib import Path


def foreign_entry(folder: Path) -> str | None:
    """What in `folder` is not its own plain file or folder (None: nothing): the folder itself or
    anything below it that is a symbolic link, a device, a pipe or a socket."""
    if folder.is_symlink():
        return f"{folder} is a symbolic link (to {os.readlink(folder)})"
    for root, dirs, files in os.walk(folder):  # a linked folder is listed here, never entered
        for name in sorted(dirs + files):
            path = Path(root, name)
            if path.is_symlink():
                return f"{path} is a symbolic link (to {os.readlink(path)})"
            if not (path.is_file() or path.is_dir()):
                return f"{path} is not a plain file or folder"
    return None


def foreign_entry_inside(folder: Path) -> str | None:
    """`foreign_entry` for what `folder` holds, the folder itself aside (it may be a link: a run
    folder on another disk)."""
    if not folder.is_dir():
        return None
    for entry in sorted(folder.iterdir()):
        found = foreign_entry(entry)
        if found:
            return found
    return None
