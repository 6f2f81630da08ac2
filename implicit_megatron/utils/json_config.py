"""A model folder's `config.json`, whoever wrote it: one ValueError naming the file where it is not a
regular file (a folder, a FIFO that would wait for a writer for ever, a device), too large, not UTF-8
JSON, nested too deeply for the parser, or not an object, instead of a traceback or a hang."""

from __future__ import annotations

import json
from pathlib import Path

from implicit_megatron.utils.typed_yaml import config_text


def read_json_config(path: Path) -> dict:
    text = config_text(path, "JSON")  # a regular file of at most MAX_CONFIG_BYTES, in UTF-8
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a config") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data
