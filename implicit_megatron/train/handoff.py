"""Which checkpoint a launch starts from, and how it gets into this launch's layout.

A launch starts from (1) its own `latest` checkpoint: a *resume* when that checkpoint belongs to
the phase being run, a *phase handoff* when it ended an earlier phase (`curriculum.run_phase`);
or (2) `checkpoint.load`, another run's checkpoint. A resume restores everything (the optimizer
state unless checkpoint.load_optimizer=false); a handoff or a load restores the weights and, as
checkpoint.load_optimizer / load_data_state say, the optimizer state and the data position. The
step count, and with it the LR schedule, always continues across a handoff.

The layout (data-parallel size, ZeRO stage, precision) may differ from the one that saved:
- same layout, or plain optimizers on both sides (ZeRO-0 in fp32/fp16, whose state is whole):
  DeepSpeed's own load;
- otherwise, with the optimizer state: the checkpoint is converted once to a DeepSpeed universal
  checkpoint (`<tag>/universal`, by deepspeed.checkpoint.ds_to_universal) and loaded from there;
- weights only: the consolidated fp32 weights go into the model before the engine is built,
  which works for every layout (DeepSpeed's module-only load does not at another ZeRO-3 size).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from implicit_megatron.checkpoints.consolidate import consolidated_weights
from implicit_megatron.checkpoints.integrity import check_tag, fallback_hint, newest_complete, require_complete
from implicit_megatron.checkpoints.layout import (
    LATEST,
    MODEL_STATES,
    PRETRAINED_WEIGHTS,
    RUN_ID,
    ZERO3_MODEL_STATES,
    DamagedCheckpoint,
    Layout,
    checkpoint_dir,
    phase_of,
    read_client_state,
    read_latest,
    saved_layout,
    step_of,
    tags_by_step,
    write_latest,
)
from implicit_megatron.checkpoints.weights import load_weights, model_settings_changed
from implicit_megatron.config import Config
from implicit_megatron.errors import RunRefused


@dataclass
class Source:
    folder: Path  # a checkpoints/ folder, or an exported/imported model folder
    tag: str  # "" for a model folder
    resuming: bool  # this run's own checkpoint, same phase: restore everything
    saved: Layout | None  # None for a model folder
    load_optimizer: bool
    load_data_state: bool
    how: str = "native"  # native | universal | weights | pretrained (a model folder: weights, step 0)

    @property
    def path(self) -> Path:
        return self.folder / self.tag


def resume_tag(cfg: Config, log) -> str | None:
    """The complete tag of this run's own checkpoints to start from (None: there are none).

    `latest` names it. When `latest` is missing or unreadable while tag folders exist, or names a
    tag that is incomplete or corrupt, the newest complete tag is taken instead, with a warning
    naming the damaged file, and `latest` is rewritten to name it (checkpoint.on_damaged=fail
    refuses instead). Never a fresh start over existing checkpoints. Run by rank 0 only: it reads
    every file of the tag it returns.
    """
    own = checkpoint_dir(cfg)
    try:
        tag, problem = read_latest(own), None
    except DamagedCheckpoint as err:
        tag, problem = None, err
    if tag is not None:
        try:
            check_tag(own / tag)
            return tag
        except DamagedCheckpoint as err:
            problem = err
    if problem is None and not tags_by_step(own):
        return None  # a new run
    if problem is None:
        problem = DamagedCheckpoint(own / LATEST, "is missing although checkpoint folders exist")
    if cfg.checkpoint.on_damaged == "fail":
        raise DamagedCheckpoint(problem.file, f"{problem.problem}; {fallback_hint(own, tag or '')}; "
                                              "checkpoint.on_damaged=fallback would resume from it")
    chosen, damaged = newest_complete(own, before=step_of(tag) if tag else None)
    if chosen is None:
        found = "; ".join(str(d) for d in [problem, *damaged][:3])
        newer = newest_complete(own)[0] if tag else None  # `latest` names an older tag than complete ones
        if newer is not None:
            raise DamagedCheckpoint(problem.file, f"{problem.problem}, and no complete checkpoint older than {tag} is "
                                                  f"in {own}, while newer ones are (the newest: {newer}); point "
                                                  f"{own / LATEST} at the one to resume from")
        raise DamagedCheckpoint(problem.file, f"{problem.problem}, and no complete checkpoint is in {own} "
                                              f"({found}); remove them or choose another train.output_dir "
                                              "to start afresh")
    for damage in [problem, *damaged]:
        log(f"warning: {damage}")
    log(f"warning: resuming from {own / chosen}, the newest complete checkpoint; `latest` now names it")
    write_latest(own, chosen)
    return chosen


def foreign_tag_problem(path: Path, run_id: str) -> str | None:
    """Why the tag at `path`, in this run's own checkpoints, is not this run's (None: it is): another
    run saved it, or the step it holds is not the step its name says (a tag renamed or copied in)."""
    saved = read_client_state(path)
    recorded_step = saved.get("step")
    if recorded_step is not None and recorded_step != step_of(path.name):
        return f"holds step {recorded_step}, not the step its name says"
    recorded_run = saved.get("run_id")
    if recorded_run is not None and recorded_run != run_id:
        return (f"was saved by another run (run id {recorded_run}; this run's is {run_id}, in "
                f"{path.parent / RUN_ID})")
    return None


def refuse_foreign_tag(cfg: Config, tag: str, run_id: str) -> None:
    """RunRefused for a tag of this run's folder that is not this run's, unless accepted explicitly."""
    path = checkpoint_dir(cfg) / tag
    problem = foreign_tag_problem(path, run_id)
    if problem and not cfg.checkpoint.accept_foreign_checkpoint:
        raise RunRefused(f"{path}: {problem}: resuming from it would not continue this run; remove it and point "
                         f"{checkpoint_dir(cfg) / LATEST} at one of this run's checkpoints, start from it with "
                         "checkpoint.load=PATH in a new output folder, or set "
                         "checkpoint.accept_foreign_checkpoint=true")


def find_source(cfg: Config, world_size: int, tag: str | None) -> Source | None:
    """The checkpoint this launch starts from and how to load it; None for a fresh start.
    `tag` is this run's own tag to resume from (`resume_tag`, chosen by rank 0)."""
    own = checkpoint_dir(cfg)
    c = cfg.checkpoint
    if tag is not None:
        run_phase = cfg.curriculum.run_phase
        resuming = run_phase is None or phase_of(tag) in (run_phase, None)
        # A resume restores the data position always, the optimizer state unless load_optimizer=false
        # (a fresh optimizer: the way to resume under a layout its state cannot convert to).
        source = Source(own, tag, resuming, saved_layout(own / tag), c.load_optimizer, resuming or c.load_data_state)
    elif c.load and (Path(c.load) / PRETRAINED_WEIGHTS).is_file():
        return Source(Path(c.load), "", False, None, False, False, how="pretrained")
    elif c.load:
        folder, tag = _named_checkpoint(Path(c.load))
        source = Source(folder, tag, False, saved_layout(folder / tag), c.load_optimizer, c.load_data_state)
    else:
        return None
    changed = model_settings_changed(source.path, cfg)
    if changed and source.load_optimizer:  # DeepSpeed's loaders would fail deep inside, or not at all
        raise RunRefused(f"{source.path}: the checkpoint's model does not fit this config's ({changed}); restore "
                         "those settings (its weights and optimizer state load only into a model of the same shape)")
    now = Layout(world_size, cfg.distributed.zero_stage, cfg.distributed.precision)
    saved = cast(Layout, source.saved)  # read only where an optimizer state loads: from a tag, which has one
    if not source.load_optimizer:
        source.how = "weights"
    elif saved == now or (saved.plain_optimizer and now.plain_optimizer):
        source.how = "native"
    elif saved.plain_optimizer or now.plain_optimizer:
        raise RunRefused(
            f"{source.path}: saved under ZeRO-{saved.zero_stage} {saved.precision} on "
            f"{saved.world_size} processes, loading under ZeRO-{now.zero_stage} {now.precision} on "
            f"{now.world_size}: a plain (ZeRO-0, not bf16) optimizer state converts only to another plain one. "
            "Keep both sides plain, or set checkpoint.load_optimizer=false to start the optimizer afresh")
    else:
        source.how = "universal"
    return source


def _named_checkpoint(path: Path) -> tuple[Path, str]:
    """checkpoint.load names a checkpoints/ folder (its `latest` is used) or one tag folder in it."""
    tag = read_latest(path)
    if tag is not None:
        return path, require_complete(path, tag)
    if read_latest(path.parent) is not None and any((path / n).is_file() for n in (MODEL_STATES, ZERO3_MODEL_STATES)):
        return path.parent, require_complete(path.parent, path.name)
    raise FileNotFoundError(f"checkpoint.load={path}: not a checkpoints folder (no '{LATEST}' file), a tag folder "
                            f"of one, or a model folder ({PRETRAINED_WEIGHTS})")


def source_weights(source: Source) -> dict[str, torch.Tensor]:
    """The fp32 weights a weights-only start loads into the model before the engine is built."""
    if source.how == "pretrained":
        from implicit_megatron.checkpoints.weights_file import read_safetensors
        from implicit_megatron.hf.export_reader import read_export

        try:
            read_export(source.folder)  # its config.json and the weights' header, as every reader of a folder
            return {k: v.float() for k, v in read_safetensors(source.folder / PRETRAINED_WEIGHTS).items()}
        except (ValueError, FileNotFoundError) as err:  # ConfigError, WeightsFileError: each names the file
            raise RunRefused(f"checkpoint.load: {err}") from None
    return consolidated_weights(source.path, cast(Layout, source.saved))  # a tag's: not pretrained


def shape_error(source: Source, cfg: Config, err: Exception) -> RunRefused:
    """A load that failed on tensor shapes or names, explained by the config keys that differ."""
    changed = model_settings_changed(source.path, cfg) if source.saved is not None else ""
    detail = changed or str(err).strip().splitlines()[0]
    return RunRefused(f"{source.path}: the checkpoint's model does not fit this config's ({detail}); "
                      "restore those settings to resume, or start from its weights in a new run")


def load_source_weights(model: torch.nn.Module, source: Source, cfg: Config) -> list[str]:
    """load_weights from a weights-only source; a misfit is explained by the config keys that differ."""
    try:
        return load_weights(model, source_weights(source), source.path)
    except ValueError as err:
        if source.saved is not None and model_settings_changed(source.path, cfg):
            raise shape_error(source, cfg, err) from None
        raise
