"""A checkpoint tag's weights as full fp32 tensors on CPU, whatever layout saved them.

    ZeRO-0               the module's weights, widened to fp32 (under fp16 or bf16 DeepSpeed keeps the
                         fp32 master weights in lists no file names: the weights the model computed with)
    ZeRO-1, bf16         DeepSpeed's BF16_Optimizer, whose shards zero_to_fp32 does not read: merged here
                         (flat_partition_weights)
    ZeRO-1/2/3 otherwise DeepSpeed's zero_to_fp32

Every file is read weights-only, and only from a tag that holds its own files alone: DeepSpeed's
consolidation globs the tag and unpickles what it finds in full (integrity.refuse_stray_files).
"""

from __future__ import annotations

from pathlib import Path

import torch

from implicit_megatron.checkpoints import safe_load
from implicit_megatron.checkpoints.integrity import expected_files, refuse_stray_files
from implicit_megatron.checkpoints.layout import Layout
from implicit_megatron.deepspeed_internals import OPTIM_STATES_SUFFIX
from implicit_megatron.utils.lean_imports import import_deepspeed


def consolidated_weights(path: Path, saved: Layout) -> dict[str, torch.Tensor]:
    """The full fp32 model state of the checkpoint tag at `path` (see the module docstring)."""
    files = expected_files(path, crc=False)
    refuse_stray_files(path, files)
    states = safe_load.load(files[0], map_location="cpu", mmap=True)
    if saved.zero_stage == 0:
        return {k: v.float() for k, v in states["module"].items()}
    shards = [f for f in files if f.name.endswith(OPTIM_STATES_SUFFIX)]
    first = safe_load.load(shards[0], map_location="cpu", mmap=True)["optimizer_state_dict"]
    if "zero_stage" not in first:  # BF16_Optimizer: DeepSpeed's ZeRO optimizers record their stage
        return flat_partition_weights(states, shards, files[0])
    import_deepspeed()
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with safe_load.weights_only_loads():
        return get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)


def flat_partition_weights(states: dict, shards: list[Path], where: Path) -> dict[str, torch.Tensor]:
    """Weights from shards that each hold one rank's equal slice of every parameter group, flattened
    in the order of the model states' `param_shapes` and padded at its end (BF16_Optimizer's layout,
    which is ZeRO-1's): a group's slices, joined in rank order, are its parameters one after another."""
    if states.get("frozen_param_shapes"):
        raise ValueError(f"{where}: holds frozen parameters, which this consolidation does not place")
    slices = [safe_load.load(f, map_location="cpu", mmap=True)["optimizer_state_dict"]
              ["single_partition_of_fp32_groups"] for f in shards]
    weights = {k: v.float() for k, v in states["module"].items() if k in states["buffer_names"]}
    for group, shapes in enumerate(states["param_shapes"]):
        flat = torch.cat([ranks[group].detach().float() for ranks in slices])
        offset = 0
        for name, shape in shapes.items():
            weights[name] = flat[offset:offset + shape.numel()].view(shape).clone()
            offset += shape.numel()
        if not 0 <= flat.numel() - offset < 2 * len(shards):  # DeepSpeed pads a group to 2 x world size
            raise ValueError(f"{where}: parameter group {group} holds {flat.numel()} values, its shapes "
                             f"{offset}: not the layout this consolidation reads")
    for copy, original in (states.get("shared_params") or {}).items():
        weights[copy] = weights[original]
    return weights
