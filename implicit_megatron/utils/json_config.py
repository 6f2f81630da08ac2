"""A model folder's `config.json`, whoever wrote it: one ValueError naming the file where it is too
large, not UTF-8 JSON, nested too deeply for the parser, or not an object, instead of a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from implicit_megatron.utils.typed_yaml import MAX_CONFIG_BYTES


def read_json_config(path: Path) -> dict:
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: {size} bytes: a config is at most {MAX_CONFIG_BYTES}")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a config") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data
