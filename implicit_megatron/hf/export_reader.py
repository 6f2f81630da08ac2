"""An exported folder as every reader of ours reads it, before a model is built from it.

`implicit_megatron.from_pretrained` (and so evaluation and generation), the transformers model's
`from_pretrained` (AutoModelForCausalLM, lm-eval's hf backend), converters and a training that starts
from a folder's weights all read a folder through `read_export_config` and `check_export_weights`:

  files        config.json and model.safetensors are regular files of the folder: not a folder, a FIFO
               or a device; a symbolic link only where it stays inside the folder, or where the
               folder is a snapshot of transformers' Hub cache (whose files link to its blobs).
  config.json  a JSON object of at most MAX_CONFIG_BYTES (utils.json_config); the run config under
               `implicit_megatron` with every key and type checked (config.saved), then the rules a
               YAML config goes through (config.rules, for one process); `eval_stop`; the fields
               transformers reads (hidden_size, num_hidden_layers, vocab_size) saying what the run
               config says; `torch_dtype` (`dtype` in transformers 5's save_pretrained) a float dtype.
  weights      model.safetensors' header, before any tensor is read: the tensors of a model built
               from that config, each of its shape and of the dtype config.json names.

Each problem is one ValueError naming the file and the key (as the file spells it:
`implicit_megatron.model.n_layers`) or tensor, and what was expected. Values that are not finite
are refused where the tensors are read (checkpoints.weights_file).

An export carries this module in its own code (hf/remote_code.py), so a folder loaded through
transformers' trust_remote_code in a Python without the package is read the same way; what it
imports is what that copy holds anyway, and utils.json_config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from implicit_megatron.checkpoints.weights_file import FLOAT_DTYPES, WeightsFileError, check_header
from implicit_megatron.config.rules import validate
from implicit_megatron.config.saved import checked_eval_stop, config_from_dict
from implicit_megatron.config.schema import Config
from implicit_megatron.utils.json_config import read_json_config
from implicit_megatron.utils.typed_yaml import ConfigError

MODEL_FILE, CONFIG_FILE = "model.safetensors", "config.json"
CONFIG_KEY = "implicit_megatron"  # config.json's entry holding the run config
DTYPE_KEYS = ("torch_dtype", "dtype")  # ours and transformers 4's; transformers 5 writes `dtype`


@dataclass(frozen=True)
class ExportConfig:
    """What config.json says: the run config, and the dtype the weights are stored in."""

    folder: Path
    cfg: Config
    dtype: str | None  # torch's name (float32, bfloat16, ...); None where config.json names none
    dtype_key: str = "torch_dtype"

    @property
    def config_file(self) -> Path:
        return self.folder / CONFIG_FILE

    @property
    def weights_file(self) -> Path:
        return self.folder / MODEL_FILE


def read_export_config(folder: str | Path) -> ExportConfig:
    """config.json of an exported folder, checked as the module docstring says."""
    folder = Path(folder)
    path = folder / CONFIG_FILE
    problem = foreign_file(path, folder)
    if problem:
        raise ConfigError(str(path), "", problem)
    data = read_json_config(path)
    if CONFIG_KEY not in data:
        raise ValueError(f"{path}: no '{CONFIG_KEY}' entry; not a folder written by tools/convert_checkpoint.py")
    cfg = checked_run_config(data[CONFIG_KEY], str(path))
    cfg.implicit.eval_stop = checked_eval_stop(data.get("eval_stop", "token"), str(path))
    check_transformers_fields(data, cfg, str(path))
    key = next((k for k in DTYPE_KEYS if data.get(k) is not None), DTYPE_KEYS[0])
    return ExportConfig(folder, cfg, stored_dtype(data.get(key), key, str(path)), key)


def checked_run_config(data, source: str) -> Config:
    """The run config an export carries, through the same checks as a YAML config: its keys and
    types, then config.rules (for one process: the folder says nothing of how many evaluate it).
    `source` names the file; keys are named as config.json spells them."""
    if not isinstance(data, dict):
        raise ConfigError(source, CONFIG_KEY, f"expected a mapping (the run config), got {type(data).__name__}")
    try:
        cfg = config_from_dict(data, source)
    except ConfigError as err:
        raise ConfigError(err.source, spelled(err.key), err.message) from None

    def fail(key: str, message: str, *also: str) -> None:
        raise ConfigError(source, spelled(key), message)

    validate(cfg, fail, world_size=1)
    return cfg


def spelled(key: str) -> str:
    """A run-config key as config.json spells it."""
    return f"{CONFIG_KEY}.{key}" if key else CONFIG_KEY


def check_transformers_fields(data: dict, cfg: Config, source: str) -> None:
    """The top-level fields that transformers and tools on it read say what the run config says."""
    m = cfg.model
    for key, value, ours in (("hidden_size", m.d_model, "model.d_model"), ("num_hidden_layers", m.n_layers,
                             "model.n_layers"), ("vocab_size", m.padded_vocab_size, "model.vocab_size, padded")):
        if key in data and data[key] != value:
            raise ConfigError(source, key, f"expected {value} ({spelled(ours)}), got {data[key]!r}")


def stored_dtype(value, key: str, source: str) -> str | None:
    if value is None:
        return None
    if value not in FLOAT_DTYPES:
        raise ConfigError(source, key, f"expected one of {', '.join(FLOAT_DTYPES)}, got {value!r}")
    return value


def check_export_weights(export: ExportConfig) -> None:
    """model.safetensors' header against the config: tensor names, shapes and dtype, read without any
    tensor and before the model is built for real (a crafted size would allocate what it says)."""
    from implicit_megatron.builder import build_model

    path = export.weights_file
    problem = foreign_file(path, export.folder)
    if problem:
        raise WeightsFileError(f"{path}: {problem}")
    shapes = {k: tuple(v.shape) for k, v in build_model(export.cfg, device="meta").state_dict().items()}
    check_header(path, shapes, str(export.config_file), export.dtype, export.dtype_key)


def read_export(folder: str | Path) -> ExportConfig:
    """Both checks: what every loader of an exported folder runs first."""
    folder = Path(folder)
    for name in (CONFIG_FILE, MODEL_FILE):
        if not (folder / name).exists() and not (folder / name).is_symlink():
            raise FileNotFoundError(f"{folder}: no {name}; export a checkpoint with tools/convert_checkpoint.py")
    export = read_export_config(folder)
    check_export_weights(export)
    return export


def foreign_file(path: Path, folder: Path) -> str | None:
    """Why `path` is not a regular file the folder holds (None: it is one). A FIFO is refused before
    anything opens it: an open would wait for a writer for ever."""
    if path.is_symlink():
        target, home = path.resolve(), folder.resolve()
        hub_blobs = home.parent.parent / "blobs" if home.parent.name == "snapshots" else None
        if not (target.is_relative_to(home) or (hub_blobs is not None and target.is_relative_to(hub_blobs))):
            return f"a symbolic link to {target}, outside {folder}: an export folder holds its own files"
    if not path.is_file():
        return "not a regular file (a folder, a FIFO or a device)"
    return None
