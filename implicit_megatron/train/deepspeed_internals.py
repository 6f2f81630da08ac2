"""The one place where DeepSpeed's (and torch.distributed's) private attributes are named.

Everything else goes through DeepSpeed's public API (initialize, init_distributed, backward, step,
save_checkpoint, load_checkpoint, module, optimizer.param_groups). Three needs have no public way:

- every file a save writes, wrapped (`engine_writes_wrapped`): DeepSpeed writes a checkpoint's
  files through `engine.checkpoint_engine.save` and copies its recovery script with
  `engine._copy_recovery_script`; a failed write raised out of save_checkpoint skips DeepSpeed's
  barriers on that rank while the others wait at them (train/checkpointer.py records it instead);
- the shared-memory collective op not built on CPU (`without_shm_comm_op`): DeepSpeed compiles it
  (about 90 s) at the first init on CPU, through its table `deepspeed.ops.__compatible_ops__`;
- the process groups DeepSpeed makes itself (torch.distributed.new_group without a timeout) given
  the run's collective timeout (`default_group_timeout`): torch's module-level defaults
  `distributed_c10d.default_pg_timeout` (and the NCCL one) are the one place that reaches them.

tests/unit/train/test_deepspeed_internals.py fails when a DeepSpeed or torch release renames
them, changes their signatures, or stops calling them from save_checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import timedelta

from implicit_megatron.utils.lean_imports import import_deepspeed

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


def default_group_timeout(timeout: timedelta) -> None:
    """The timeout of the process groups DeepSpeed creates without one."""
    from torch.distributed import distributed_c10d

    for name in GROUP_TIMEOUTS:
        if hasattr(distributed_c10d, name):
            setattr(distributed_c10d, name, timeout)
