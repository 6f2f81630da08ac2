"""A model folder's weights file, whoever wrote it: one error naming the file where it is not whole (a
cut download, a crafted header or offsets), not plain tensors (a pickle that would run code is
refused before any of it runs) or not finite (a NaN weight computes nothing but NaN), instead of the
reader's traceback or a NaN result."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from implicit_megatron.errors import first_line


class WeightsFileError(ValueError):
    """A weights file that cannot be read as tensors; the message names it."""


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise WeightsFileError(f"{path}: not a whole safetensors file ({first_line(err)})") from None
    refuse_nonfinite(state, path)
    return state


def refuse_nonfinite(state: dict[str, torch.Tensor], path: Path | str) -> None:
    """The first floating-point tensor holding NaN or infinity, named with the file it came from."""
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise WeightsFileError(f"{path}: {name} holds values that are not finite (NaN or inf: {bad} of "
                                   f"{tensor.numel()}); such weights compute nothing but NaN")


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape from the file's header alone (no tensor is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 - a safe_open handle, not a dict
    except (SafetensorError, OSError) as err:
        raise WeightsFileError(f"{path}: not a whole safetensors file ({first_line(err)})") from None


def check_shapes(path: Path, expected: dict[str, tuple[int, ...]], config: str) -> None:
    """The tensors a model built from `config` has, against the weights file's header: a config that
    does not describe these weights (a size changed, a crafted d_model of 2^20) is refused by name
    before the model is built for real, which would allocate whatever the config says."""
    found = safetensors_shapes(path)
    missing, unexpected = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    if missing or unexpected:
        raise WeightsFileError(f"{path}: does not hold the tensors of the model {config} describes "
                               f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, shape in expected.items():
        if tuple(found[name]) != tuple(shape):
            raise WeightsFileError(f"{path}: {name} is {list(found[name])} here, but the model {config} describes "
                                   f"has {list(shape)}")


def read_torch_weights(path: Path) -> dict[str, torch.Tensor]:
    """A `pytorch_model.bin`: read weights-only, so that no object in it is built."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as err:
        raise WeightsFileError(f"{path}: not a file of plain tensors; refused without running any of it "
                               f"({first_line(err)})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise WeightsFileError(f"{path}: holds no mapping of tensor names to tensors")
    refuse_nonfinite(state, path)
    return state
