"""The private attributes of DeepSpeed and torch that the run depends on (deepspeed_internals.py)
are still there, with the signatures and the callers it assumes, and DeepSpeed names its files as that
module spells them (no other module does): a release that changes one fails here, not silently in a save
on a full disk, a 90-s build on CPU or a checkpoint read as incomplete."""

from __future__ import annotations

import functools
import inspect
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from implicit_megatron import deepspeed_internals as internals
from implicit_megatron.utils.lean_imports import import_deepspeed

ROOT = Path(__file__).resolve().parents[2]


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


def test_deepspeed_names_its_checkpoint_files_as_spelled_here(engine_class):
    """The names every reader of a tag without DeepSpeed uses (integrity, layout, consolidation, the
    universal conversion) are the ones DeepSpeed's engine and converter write."""
    from deepspeed.checkpoint import constants, ds_to_universal

    engine = SimpleNamespace(zero_optimization_partition_weights=lambda: False)
    assert Path(engine_class._get_ckpt_name(engine, "c", "t", mp_placeholder="00")).name == internals.MODEL_STATES
    engine.zero_optimization_partition_weights = lambda: True
    engine._get_zero_ckpt_prefix = functools.partial(engine_class._get_zero_ckpt_prefix, engine)
    for rank in (0, 3):
        name = Path(engine_class._get_ckpt_name(engine, "c", "t", mp_placeholder="00", pp_placeholder=rank)).name
        assert name == internals.zero3_model_states_file(rank)
        for bf16 in (False, True):
            name = Path(engine_class._get_rank_zero_ckpt_name(engine, "c", "t", 0, rank, bf16)).name
            assert name == internals.optim_states_file(rank, bf16)
    assert (internals.MODEL_STATES_SUFFIX, internals.OPTIM_STATES_SUFFIX) == \
        (constants.MODEL_FILE_SUFFIX, constants.OPTIM_FILE_SUFFIX)
    assert internals.BF16_PREFIX + constants.ZERO_FILE_PREFIX == constants.BF16_ZERO_FILE_PREFIX
    assert internals.UNIVERSAL_INFO == constants.UNIVERSAL_CHECKPOINT_INFO
    converter = inspect.getsource(ds_to_universal)
    step = Path(internals.universal_param_file("w", "step")).name
    for name in (internals.UNIVERSAL_NOTE, internals.UNIVERSAL_ZERO, internals.UNIVERSAL_OPTIMIZER_STATE, step):
        assert re.search(rf"""['"]{re.escape(name)}['"]""", converter), name


DEEPSPEED_FILE_NAME = re.compile(r"model_states\.pt|optim_states\.pt|optimizer_state\.pt|zero_pp_rank|mp_rank_|"
                                 r"latest_universal")


def test_no_module_but_deepspeed_internals_spells_a_deepspeed_file_name():
    """A DeepSpeed release that renames its files is then met in one module (and in the test above)."""
    sources = [path for folder in ("implicit_megatron", "data_pipeline", "tools", "launch")
               for path in sorted((ROOT / folder).rglob("*")) if path.suffix in (".py", ".sh")]
    spelled = [f"{path.relative_to(ROOT)}:{number}" for path in sources
               for number, line in enumerate(path.read_text().splitlines(), 1) if DEEPSPEED_FILE_NAME.search(line)]
    own = "implicit_megatron/deepspeed_internals.py"
    assert len(sources) > 100 and any(where.startswith(own) for where in spelled)  # the scan sees them
    assert [where for where in spelled if not where.startswith(own)] == []
