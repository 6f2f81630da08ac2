"""The one place where DeepSpeed's file names and its (and torch.distributed's) private attributes are named.

Everything else goes through DeepSpeed's public API (initialize, init_distributed, backward, step,
save_checkpoint, load_checkpoint, module, optimizer.param_groups). Reading a checkpoint without
DeepSpeed (checkpoints/: integrity, layout, consolidation, universal conversion; exports) needs the
names of the files DeepSpeed writes: they are spelled here only, as DeepSpeed's engine and
ds_to_universal spell them.

Four needs have no public way:

- every file a save writes, wrapped (`engine_writes_wrapped`): DeepSpeed writes a checkpoint's
  files through `engine.checkpoint_engine.save` and copies its recovery script with
  `engine._copy_recovery_script`; a failed write raised out of save_checkpoint skips DeepSpeed's
  barriers on that rank while the others wait at them (train/checkpointer.py records it instead);
- the shared-memory collective op not built on CPU (`without_shm_comm_op`): DeepSpeed compiles it
  (about 90 s) at the first init on CPU, through its table `deepspeed.ops.__compatible_ops__`;
- the memory report DeepSpeed's BF16_Optimizer prints at every engine start (`memory_report_to_debug`):
  three lines per call, six calls with two parameter groups, through print() with force=True, so no
  logging setting reaches it: the function as that module imported it is the one place;
- the process groups DeepSpeed makes itself (torch.distributed.new_group without a timeout) given
  the run's collective timeout (`default_group_timeout`): torch's module-level defaults
  `distributed_c10d.default_pg_timeout` (and the NCCL one) are the one place that reaches them.

tests/unit/test_deepspeed_internals.py fails when a DeepSpeed or torch release renames them,
changes their signatures, stops calling them from save_checkpoint, or names its files otherwise.
Importing this module imports no DeepSpeed (checkpoints/ and the tools read files without it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import timedelta

from implicit_megatron.utils.lean_imports import import_deepspeed

# ------------------------------------------------------------ the files of a DeepSpeed checkpoint tag

MODEL_STATES_SUFFIX = "_model_states.pt"  # the module and our client state (config, step, data position)
OPTIM_STATES_SUFFIX = "_optim_states.pt"  # a partitioned optimizer's shard of one rank
BF16_PREFIX = "bf16_"  # before an optimizer shard's name when the engine runs in bf16 (DeepSpeed's BF16_Optimizer)


def zero3_model_states_file(rank: int) -> str:
    """ZeRO-3's model states: one file per data-parallel rank."""
    return f"zero_pp_rank_{rank}_mp_rank_00{MODEL_STATES_SUFFIX}"


def optim_states_file(rank: int, bf16: bool) -> str:
    """A partitioned optimizer's (ZeRO-1/2/3) state of one data-parallel rank, named by the engine's precision."""
    return f"{BF16_PREFIX if bf16 else ''}zero_pp_rank_{rank}_mp_rank_00{OPTIM_STATES_SUFFIX}"


MODEL_STATES = f"mp_rank_00{MODEL_STATES_SUFFIX}"  # ZeRO 0-2: one file, written by rank 0 for all ranks
ZERO3_MODEL_STATES = zero3_model_states_file(0)  # ZeRO-3: rank 0's, the one read for the client state

# ------------------------------------------------------------ a universal checkpoint (ds_to_universal)

UNIVERSAL_INFO = "universal_checkpoint_info"  # a client-state key DeepSpeed's conversion looks for
UNIVERSAL_NOTE = "latest_universal"  # a line ds_to_universal leaves beside its input (its output's name)
UNIVERSAL_ZERO = "zero"  # the folder of a conversion holding one folder per parameter
UNIVERSAL_OPTIMIZER_STATE = "optimizer_state.pt"  # in UNIVERSAL_ZERO: the optimizer's global state


def universal_param_file(name: str, key: str) -> str:
    """A parameter's tensor `key` (fp32, exp_avg, exp_avg_sq; step: the optimizer step) in a conversion,
    relative to it (`name` '*': a pattern for every parameter)."""
    return f"{UNIVERSAL_ZERO}/{name}/{key}.pt"


# ------------------------------------------------------------ private attributes

CHECKPOINT_ENGINE = "checkpoint_engine"  # engine.checkpoint_engine.save(state_dict, path): every checkpoint file
RECOVERY_SCRIPT = "_copy_recovery_script"  # engine._copy_recovery_script(save_path): zero_to_fp32.py beside it
SHM_COMM_OP = "deepspeed_shm_comm"  # a key of deepspeed.ops.__compatible_ops__
GROUP_TIMEOUTS = ("default_pg_timeout", "default_pg_nccl_timeout")  # torch.distributed.distributed_c10d


@contextlib.contextmanager
def engine_writes_wrapped(engine, wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """While it lasts, each file write of engine.save_checkpoint goes through `wrap(write)`."""
    writer = getattr(engine, CHECKPOINT_ENGINE)
    writer.save = wrap(writer.save)
    setattr(engine, RECOVERY_SCRIPT, wrap(getattr(engine, RECOVERY_SCRIPT)))
    try:
        yield
    finally:
        del writer.save  # the class's own again
        delattr(engine, RECOVERY_SCRIPT)


def without_shm_comm_op() -> None:
    """No shared-memory collective op on CPU (gloo does the work; building it costs 90 s)."""
    import_deepspeed()
    import deepspeed

    deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False


BF16_MEMORY_REPORT = ("deepspeed.runtime.bf16_optimizer", "see_memory_usage")  # module, the name it imported


def memory_report_to_debug() -> None:
    """BF16_Optimizer's memory report (18 lines before the first step of a bf16 ZeRO-1 run) goes to
    the debug log: a line per call, the message and the memory allocated."""
    import importlib
    import logging

    import_deepspeed()
    module = importlib.import_module(BF16_MEMORY_REPORT[0])
    logger = logging.getLogger("implicit_megatron.deepspeed")

    def to_debug(message: str, force: bool = False) -> None:
        from deepspeed.accelerator import get_accelerator

        logger.debug("DeepSpeed memory, %s: %.2f GiB allocated", message, get_accelerator().memory_allocated() / 2**30)

    setattr(module, BF16_MEMORY_REPORT[1], to_debug)


def default_group_timeout(timeout: timedelta) -> None:
    """The timeout of the process groups DeepSpeed creates without one."""
    from torch.distributed import distributed_c10d

    for name in GROUP_TIMEOUTS:
        if hasattr(distributed_c10d, name):
            setattr(distributed_c10d, name, timeout)
