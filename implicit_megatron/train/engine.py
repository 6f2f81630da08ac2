"""DeepSpeed set-up derived from our config: process group, ZeRO stage, precision, batch sizes.

Our config is the single source of truth; the DeepSpeed JSON is computed from it (and saved with
every checkpoint through the resolved config), never written by hand.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
from torch import nn

from implicit_megatron.config import Config
from implicit_megatron.deepspeed_internals import default_group_timeout, memory_report_to_debug, without_shm_comm_op
from implicit_megatron.train.optim import build_optimizer
from implicit_megatron.utils.lean_imports import import_deepspeed


def init_distributed(cfg: Config) -> None:
    """Start the process group (gloo on CPU, NCCL/RCCL on GPUs) once per process."""
    import_deepspeed()
    import deepspeed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    if not torch.cuda.is_available():
        without_shm_comm_op()  # DeepSpeed otherwise compiles a shared-memory op (~90 s) at the first init on CPU
    memory_report_to_debug()
    timeout = collective_timeout(cfg)
    default_group_timeout(timeout)  # DeepSpeed's own groups take torch's default (30 minutes) otherwise
    deepspeed.init_distributed(dist_backend=process_group_backend(cfg), verbose=False, timeout=timeout)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def collective_timeout(cfg: Config) -> timedelta:
    """The process groups' own timeout, distributed.collective_timeout_minutes: above anything the stall
    watch allows (train/callbacks/stall.py, the one judge of a stall), so that it ends only collectives that
    living ranks never meet, and never a rank that is slow while its heartbeat goes on."""
    return timedelta(minutes=cfg.distributed.collective_timeout_minutes)


def local_device() -> torch.device:
    """This rank's device, as init_distributed set it and the engine will use it: its GPU, or the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def process_group_backend(cfg: Config) -> str:
    """distributed.backend, with `auto` as NCCL (RCCL on ROCm) where there are GPUs, else gloo."""
    if cfg.distributed.backend != "auto":
        return cfg.distributed.backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def deepspeed_config(cfg: Config, world_size: int, load_universal: bool = False) -> dict:
    t = cfg.train
    accumulation = t.global_batch_size // (t.micro_batch_size * world_size)
    precision = cfg.distributed.precision
    return {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": cfg.optimizer.grad_clip,
        "zero_optimization": {"stage": cfg.distributed.zero_stage},
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", "loss_scale": 0, "initial_scale_power": 16},
        "zero_allow_untested_optimizer": True,
        # Accumulate and reduce bf16 gradients in fp32, as Megatron does (DeepSpeed supports it from ZeRO-1).
        **({"data_types": {"grad_accum_dtype": "fp32"}}
           if precision == "bf16" and cfg.distributed.zero_stage >= 1 else {}),
        # Loading a checkpoint saved at another world size or ZeRO stage (see train/starts.py).
        **({"checkpoint": {"load_universal": True}} if load_universal else {}),
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def build_engine(cfg: Config, model: nn.Module, load_universal: bool = False):
    """Wrap `model` in a DeepSpeed engine with torch's AdamW; returns the engine."""
    import_deepspeed()
    import deepspeed

    init_distributed(cfg)
    world_size = torch.distributed.get_world_size()
    if torch.cuda.is_available():
        model = model.cuda()
    engine, *_ = deepspeed.initialize(model=model, optimizer=build_optimizer(model, cfg.optimizer),
                                      config=deepspeed_config(cfg, world_size, load_universal))
    return engine
