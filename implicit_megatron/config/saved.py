"""A config that a checkpoint or an exported folder saved, read back as a Config.

Its own module, in the config package, because the transformers model of an export reads it too
(hf/model.py): an export's own copy of the package (hf/remote_code.py) carries it without the
checkpoint readers around it.
"""

from __future__ import annotations

from typing import Literal

from implicit_megatron.config.schema import EVAL_STOPS, Config
from implicit_megatron.utils.typed_yaml import build_dataclass

RETIRED_KEYS = {("train", "eval_iters")}  # saved by earlier versions; validation now reads train.eval_samples


def config_from_dict(data: dict, source: str) -> Config:
    """The config a checkpoint or folder saved; keys earlier versions wrote and this one retired are
    dropped, so that their checkpoints still export, evaluate and resume."""
    data = {section: ({k: v for k, v in values.items() if (section, k) not in RETIRED_KEYS}
                      if isinstance(values, dict) else values) for section, values in data.items()}
    cfg = build_dataclass(Config, data, {k: source for k in data})
    cfg.source = source
    return cfg


def checked_eval_stop(value, source: str) -> Literal["token", "sequence", "batch"]:
    """An exported model's stop rule outside training: its config's top-level `eval_stop` (the run
    config inside records how the run validated, and folders exported before this field existed hold
    the old default there), "token" unless a client names another rule."""
    if value not in EVAL_STOPS:
        raise ValueError(f"{source}: eval_stop must be one of {', '.join(EVAL_STOPS)}, not {value!r}")
    return value
