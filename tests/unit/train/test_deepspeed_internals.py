"""The private attributes of DeepSpeed and torch that the run depends on (train/deepspeed_internals.py)
are still there, with the signatures and the callers it assumes: a release that changes one fails here,
not silently in a save on a full disk or a 90-s build on CPU."""

from __future__ import annotations

import inspect
import re
from datetime import timedelta

import pytest

from implicit_megatron.train import deepspeed_internals as internals
from implicit_megatron.utils.lean_imports import import_deepspeed


@pytest.fixture(scope="module")
def engine_class():
    import_deepspeed()
    from deepspeed.runtime.engine import DeepSpeedEngine

    return DeepSpeedEngine


def test_save_checkpoint_writes_every_file_through_the_names_wrapped(engine_class):
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    assert list(inspect.signature(TorchCheckpointEngine.save).parameters) == ["self", "state_dict", "path"]
    assert list(inspect.signature(getattr(engine_class, internals.RECOVERY_SCRIPT)).parameters) == \
        ["self", "save_path"]
    source = inspect.getsource(engine_class)
    # the model and optimizer states of every ZeRO stage, and the recovery script
    assert len(re.findall(rf"self\.{internals.CHECKPOINT_ENGINE}\.save\(", source)) >= 4
    assert re.search(rf"self\.{internals.RECOVERY_SCRIPT}\(", source)
    assert not re.search(r"torch\.save\(", inspect.getsource(engine_class.save_checkpoint))


def test_the_wrap_lasts_as_long_as_the_context_and_leaves_the_classes_own(engine_class):
    import torch
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    engine = object.__new__(engine_class)  # an nn.Module without DeepSpeed's set-up: attributes as on a real one
    torch.nn.Module.__init__(engine)
    engine.checkpoint_engine = TorchCheckpointEngine()
    calls = []

    def wrap(write):
        def wrapped(*args):
            calls.append(args)
        return wrapped

    with internals.engine_writes_wrapped(engine, wrap):
        engine.checkpoint_engine.save({}, "x.pt")
        engine._copy_recovery_script("folder")
    assert calls == [({}, "x.pt"), ("folder",)]
    assert engine.checkpoint_engine.save.__func__ is TorchCheckpointEngine.save
    assert engine._copy_recovery_script.__func__ is getattr(engine_class, internals.RECOVERY_SCRIPT)


def test_the_shm_op_and_the_group_timeouts_are_where_they_are_set():
    import_deepspeed()
    import deepspeed
    from torch.distributed import distributed_c10d

    assert internals.SHM_COMM_OP in deepspeed.ops.__compatible_ops__
    before = distributed_c10d.default_pg_timeout
    assert isinstance(before, timedelta)
    try:
        internals.default_group_timeout(timedelta(minutes=7))
        assert distributed_c10d.default_pg_timeout == timedelta(minutes=7)
    finally:
        internals.default_group_timeout(before)
    # new_group without a timeout takes the module's default when it is called, not when defined
    assert "default_pg_timeout" in inspect.getsource(distributed_c10d)
