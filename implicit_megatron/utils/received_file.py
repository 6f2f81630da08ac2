"""The bytes of a small file someone else may have made: a regular file (not a FIFO, which would
wait for a writer for ever, a device or a folder), read up to a limit whatever size the file system
reports, opened without blocking; JSON parsed with its nesting bounded. Each reader turns
`UnreadableFile` into its own error; the message already names the file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any


class UnreadableFile(ValueError):
    """Not a small regular file, or not the text it should be; the message starts with the path."""


def read_small_file(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """At most `limit` bytes of `path`; UnreadableFile naming it and `what` it should be otherwise."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise UnreadableFile(f"{path}: missing") from None
    except OSError as err:
        raise UnreadableFile(f"{path}: cannot be read ({err.strerror or type(err).__name__})") from None
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise UnreadableFile(f"{path}: not a regular file (a FIFO, a device or a folder); expected {what}")
    with os.fdopen(handle, "rb") as file:
        try:
            data = file.read(limit + 1)
        except OSError as err:
            raise UnreadableFile(f"{path}: cannot be read ({err.strerror or type(err).__name__})") from None
    if len(data) > limit:
        raise UnreadableFile(f"{path}: over {limit} bytes; {what} is at most that")
    return data


def read_small_text(path: str | os.PathLike, limit: int, what: str) -> str:
    try:
        return read_small_file(path, limit, what).decode("utf-8")
    except UnicodeDecodeError as err:
        raise UnreadableFile(f"{path}: not UTF-8 text (byte {err.start}); expected {what}") from None


def read_small_json(path: str | os.PathLike | Path, limit: int, what: str) -> Any:
    text = read_small_text(path, limit, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UnreadableFile(f"{path}: not JSON ({err}); expected {what}") from None
    except RecursionError:
        raise UnreadableFile(f"{path}: nested too deeply; expected {what}") from None
