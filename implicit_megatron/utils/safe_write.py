"""Writing a run folder's small files without following links.

A run folder may come from elsewhere (copied, unpacked, shared). A file opened by name follows a
symbolic link planted in its place, so a resume would write its config, its `latest` or its
metrics into whatever file the link names. Here a file is replaced whole instead (a new temporary
file beside it, created exclusively, then renamed over the name: a link there is replaced, never
followed, and a kill leaves the old file), and an append refuses a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

OUT_OF_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, a quota, a file-size limit


def out_of_room(err: BaseException) -> bool:
    """Whether a write failed for want of room, as the OS says it or safetensors (which keeps no errno)."""
    if isinstance(err, OSError):
        return err.errno in OUT_OF_ROOM
    return type(err).__name__ == "SafetensorError"


NEARLY_FULL = 1 << 20  # bytes free below which a write cut short is put down to a full disk


def room_cause(said: str, folder: str | Path, written: str | Path | None = None) -> str | None:
    """Why a write into `folder` was cut short, in plain words, when it was for want of room (None
    when nothing shows that). `said` is what the writer reported: the OS's words where it kept them
    (safetensors wraps them in its IoError); torch cuts a write short without them ("unexpected
    pos"), so the free space and the file size limit (`written` at it) are measured as well."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    size_limit = f"the file size limit of this process was reached (ulimit -f: {limit} bytes)"
    if os.strerror(errno.ENOSPC) in said:
        return "no space left on device"
    if os.strerror(errno.EDQUOT) in said:
        return "the disk quota was exceeded"
    if os.strerror(errno.EFBIG) in said:
        return size_limit if limit != resource.RLIM_INFINITY else "the file is larger than its file system allows"
    free = shutil.disk_usage(folder).free if Path(folder).is_dir() else None
    if free is not None and free < NEARLY_FULL:
        return f"no space left on device ({free} bytes free)"
    if limit != resource.RLIM_INFINITY and written is not None and Path(written).is_file() and \
            Path(written).stat().st_size >= limit:
        return size_limit
    return None


def room_cause_of(err: BaseException, folder: str | Path, written: str | Path | None = None) -> str | None:
    """`room_cause` of a raised error (its errno's words where it has one)."""
    said = os.strerror(err.errno) if isinstance(err, OSError) and err.errno else str(err)
    return room_cause(said, folder, written or getattr(err, "filename", None))


@contextlib.contextmanager
def replaced_files(paths: list[Path]) -> Iterator[list[Path]]:
    """Paths to write in a new hidden folder beside the first of `paths` (made exclusively: a link
    planted beside is never written through); when the block ends without error each is renamed over
    its own name, so a full disk, a size limit or a kill leaves the files there before, never a cut
    one (nor one file of a pair). The hidden folder is removed either way."""
    folder = Path(tempfile.mkdtemp(dir=paths[0].parent, prefix=f".{paths[0].name}.", suffix=".tmp"))
    try:
        partials = [folder / p.name for p in paths]
        yield partials
        for partial, path in zip(partials, paths, strict=True):
            os.replace(partial, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def replace_text(path: str | Path, text: str, fsync: bool = False) -> None:
    """`path` holds `text`, written whole (see the module docstring); `fsync` makes it durable."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as open() would make it: others on a cluster read run files
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_append(path: str | Path) -> TextIO:
    """`path` opened to append text, created if missing; OSError naming it when it is a link."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as err:
        if Path(path).is_symlink():
            raise OSError(err.errno, f"{path} is a symbolic link (to {os.readlink(path)}); a run writes its own "
                                     "files only") from None
        raise
    return os.fdopen(fd, "a")


def remove_leftover(path: str | Path) -> None:
    """Remove what an interrupted run may have left at `path` before a folder is made there: a folder
    (with what it holds), or anything else, a link included, as itself (never a link's target)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
