"""A model folder's weights file, whoever wrote it: one error naming the file where it is not whole (a
cut download, a crafted header or offsets), not plain tensors (a pickle that would run code is
refused before any of it runs), not the tensors, shapes and dtype its config describes (check_header,
from the header alone) or not finite (a NaN weight computes nothing but NaN), instead of the
reader's traceback, a model of garbage or a NaN result."""

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


def nonfinite_count(tensor: torch.Tensor) -> int:
    """How many values of a floating-point tensor are NaN or infinite (0 for any other tensor); the one
    test of every reader of weights, checkpoints' too (checkpoints.integrity)."""
    if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
        return 0
    return int((~torch.isfinite(tensor)).sum())


def refuse_nonfinite(state: dict[str, torch.Tensor], path: Path | str) -> None:
    """The first floating-point tensor holding NaN or infinity, named with the file it came from."""
    for name, tensor in state.items():
        bad = nonfinite_count(tensor)
        if bad:
            raise WeightsFileError(f"{path}: {name} holds values that are not finite (NaN or inf: {bad} of "
                                   f"{tensor.numel()}); such weights compute nothing but NaN")


FLOAT_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64"}  # torch's name: header's


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's dtype (the header's code: F32, BF16, I32, ...) and shape, from the file's header
    alone (no tensor is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            slices = {name: f.get_slice(name) for name in f.keys()}  # noqa: SIM118 - a safe_open handle, not a dict
            return {name: (s.get_dtype(), tuple(s.get_shape())) for name, s in slices.items()}
    except (SafetensorError, OSError) as err:
        raise WeightsFileError(f"{path}: not a whole safetensors file ({first_line(err)})") from None


def check_header(path: Path, expected: dict[str, tuple[int, ...]], config: str, dtype: str | None = None,
                 dtype_key: str = "torch_dtype") -> None:
    """The tensors a model built from `config` has, against the weights file's header: a config that
    does not describe these weights (a size changed, a crafted d_model of 2^20) is refused by name
    before the model is built for real, which would allocate whatever the config says. Each tensor
    is stored in `dtype` (torch's name, as the config's `dtype_key` says it), or, where it names none, in
    one of FLOAT_DTYPES: bytes of another dtype (an I32 in the header) are not these weights, whatever
    their size."""
    found = safetensors_header(path)
    missing, unexpected = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
    if missing or unexpected:
        raise WeightsFileError(f"{path}: does not hold the tensors of the model {config} describes "
                               f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    allowed = {FLOAT_DTYPES[dtype]} if dtype is not None else set(FLOAT_DTYPES.values())
    for name, shape in expected.items():
        code, stored = found[name]
        if tuple(stored) != tuple(shape):
            raise WeightsFileError(f"{path}: {name} is {list(stored)} here, but the model {config} describes "
                                   f"has {list(shape)}")
        if code not in allowed:
            said = f"{dtype_key} {dtype} in {config}" if dtype is not None else f"{config} names no dtype"
            raise WeightsFileError(f"{path}: {name}: dtype {code}, expected {' or '.join(sorted(allowed))} ({said})")


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
