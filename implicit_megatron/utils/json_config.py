"""A model folder's `config.json`, whoever wrote it: one ValueError naming the file where it is not a
regular file (a folder, a FIFO that would wait for a writer for ever, a device), too large, not UTF-8
JSON, nested too deeply for the parser, or not an object, instead of a traceback or a hang. A key given
twice in one object is refused too: JSON parsers keep the last one without a word, so a file could say
one value and mean another (as a YAML config may not, utils.typed_yaml)."""

from __future__ import annotations

import json
from pathlib import Path

from implicit_megatron.utils.typed_yaml import config_text


class _GivenTwice(Exception):
    """A key twice in one JSON object (raised inside the parser, turned into the file's ValueError)."""


def _once(pairs: list[tuple[str, object]]) -> dict:
    found: dict = {}
    for key, value in pairs:
        if key in found:
            raise _GivenTwice(key)
        found[key] = value
    return found


def read_json_config(path: Path) -> dict:
    text = config_text(path, "JSON")  # a regular file of at most MAX_CONFIG_BYTES, in UTF-8
    try:
        data = json.loads(text, object_pairs_hook=_once)
    except _GivenTwice as err:
        raise ValueError(f"{path}: the key {err.args[0]!r} is given twice in one object") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a config") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data
