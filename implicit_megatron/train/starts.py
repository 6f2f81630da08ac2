"""The kinds of start from a checkpoint: a closed set, each kind one class that knows how it loads.

    Native       a tag saved under this launch's layout (data-parallel size, ZeRO stage, precision),
                 or with plain optimizers on both sides (ZeRO-0 in fp32/fp16, whose state is whole):
                 DeepSpeed's own load
    Universal    a tag saved under another layout, with its optimizer state: converted once to a
                 DeepSpeed universal checkpoint (`<tag>/universal`, checkpoints.universal), which the
                 engine, told load_universal, loads
    WeightsOnly  a tag without its optimizer state (checkpoint.load_optimizer=false): its consolidated
                 fp32 weights go into the model before the engine exists, which works for every layout
                 (DeepSpeed's module-only load does not at another ZeRO-3 size)
    Pretrained   a model folder (model.safetensors, by tools/convert_checkpoint.py export or import):
                 its weights, from step 0

Which checkpoint a launch starts from is train/handoff.py's (a `StartContext`); `find_source` asks every
kind in turn whether it applies (`choose`). A kind knows what it does before the engine exists
(`before_engine`), what DeepSpeed's config must say (`loads_universal`), what it loads into the
engine (`into_engine`) and how the log names it (`describe`). A subclass of Start with its own
`how` is a kind, asked in the order the kinds are defined: adding one touches no other file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, cast

import torch
import torch.distributed as dist

from implicit_megatron.checkpoints import safe_load
from implicit_megatron.checkpoints.consolidate import consolidated_weights
from implicit_megatron.checkpoints.layout import (
    LATEST,
    PRETRAINED_WEIGHTS,
    UNIVERSAL,
    Layout,
    checkpoint_dir,
    read_client_state,
)
from implicit_megatron.checkpoints.universal import to_universal
from implicit_megatron.checkpoints.weights import load_weights, model_settings_changed
from implicit_megatron.config import Config
from implicit_megatron.errors import RunRefused, RunStopped
from implicit_megatron.train.handoff import StartContext


def nonfinite_weights(module: torch.nn.Module) -> list[str]:
    """The parameters of `module` holding NaN or infinity on this rank (ZeRO-3: its partitions)."""
    return [name for name, p in module.named_parameters()
            if not bool(torch.isfinite(getattr(p, "ds_tensor", p).detach()).all())]


@dataclass(kw_only=True)
class Start:
    """A checkpoint a launch starts from and what of it this launch restores; one subclass per kind."""

    folder: Path  # a checkpoints/ folder, or a model folder
    tag: str = ""  # "" for a model folder
    resuming: bool = False  # this run's own checkpoint, same phase: restore everything
    saved: Layout | None = None  # the layout that saved it (None: not a DeepSpeed tag)
    load_optimizer: bool = False
    load_data_state: bool = False

    KINDS: ClassVar[list[type[Start]]] = []  # every kind, in the order find_source asks them
    how: ClassVar[str]  # the kind's name, in the log line (which launch scripts and tests read)
    loads_universal: ClassVar[bool] = False  # DeepSpeed's config must name a universal checkpoint

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "how" in vars(cls):  # a kind; a base that kinds share (WeightsFirst, EngineLoad) has no `how`
            Start.KINDS.append(cls)

    @classmethod
    def choose(cls, launch: StartContext) -> Start | None:
        """This kind's start for `launch`; None where the kind does not apply, RunRefused where it
        does but the checkpoint cannot load as asked."""
        raise NotImplementedError

    @property
    def path(self) -> Path:
        return self.folder / self.tag

    def describe(self) -> str:
        """How the start-up log names the start, e.g. ".../bounded-step1 (resume, native)"."""
        return f"{self.path} ({'resume' if self.resuming else 'handoff/load'}, {self.how})"

    def before_engine(self, model: torch.nn.Module, cfg: Config, rank: int, log) -> None:
        """What must be done before the engine exists (every rank calls it): nothing, by default."""

    def into_engine(self, engine, cfg: Config) -> dict:
        """Load what DeepSpeed holds (weights, optimizer state) into the engine; the client state saved
        with the checkpoint ({} where there is none: the run starts at step 0)."""
        raise NotImplementedError

    def changed_settings(self, cfg: Config) -> str:
        """The model settings of `cfg` that differ from the checkpoint's ('' for none, or no DeepSpeed tag)."""
        return model_settings_changed(self.path, cfg) if self.saved is not None else ""

    def misfit(self, cfg: Config, err: Exception) -> RunRefused:
        """A load that failed on tensor shapes or names, explained by the config keys that differ."""
        detail = self.changed_settings(cfg) or str(err).strip().splitlines()[0]
        return RunRefused(f"{self.path}: the checkpoint's model does not fit this config's ({detail}); "
                          "restore those settings to resume, or start from its weights in a new run")


class WeightsFirst(Start):
    """A start whose weights go into the model before the engine exists (the engine then partitions
    them as its layout says); DeepSpeed restores nothing."""

    def weights(self) -> dict[str, torch.Tensor]:
        """The fp32 weights, by the model's names."""
        raise NotImplementedError

    def before_engine(self, model: torch.nn.Module, cfg: Config, rank: int, log) -> None:
        try:
            fresh = load_weights(model, self.weights(), self.path)
        except ValueError as err:
            if self.changed_settings(cfg):
                raise self.misfit(cfg, err) from None
            raise
        if fresh:
            log(f"kept the fresh initialisation of {len(fresh)} tensors: {', '.join(fresh[:4])}")
        bad = nonfinite_weights(model)
        if bad:
            raise RunRefused(f"{self.path}: its weights hold values that are not finite (NaN or inf) in "
                             f"{', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}: nothing would train")

    def into_engine(self, engine, cfg: Config) -> dict:
        return {}


class Pretrained(WeightsFirst):
    """A model folder checkpoint.load names: its weights, from step 0. Defined first, so asked first:
    the kinds of a tag would look for a checkpoints folder around it."""

    how = "pretrained"

    @classmethod
    def choose(cls, launch: StartContext) -> Start | None:
        folder = launch.load_path
        return cls(folder=folder) if folder is not None and (folder / PRETRAINED_WEIGHTS).is_file() else None

    def weights(self) -> dict[str, torch.Tensor]:
        from implicit_megatron.checkpoints.weights_file import read_safetensors
        from implicit_megatron.hf.export_reader import read_export

        try:
            read_export(self.folder)  # its config.json and the weights' header, as every reader of a folder
            return {k: v.float() for k, v in read_safetensors(self.folder / PRETRAINED_WEIGHTS).items()}
        except (ValueError, FileNotFoundError) as err:  # ConfigError, WeightsFileError: each names the file
            raise RunRefused(f"checkpoint.load: {err}") from None


class WeightsOnly(WeightsFirst):
    """A tag's weights without its optimizer state, from any layout; the step, and the data position
    as asked, continue."""

    how = "weights"

    @classmethod
    def choose(cls, launch: StartContext) -> Start | None:
        found = launch.checkpoint
        return cls(**found.keywords()) if found is not None and not found.load_optimizer else None

    def weights(self) -> dict[str, torch.Tensor]:
        return consolidated_weights(self.path, cast(Layout, self.saved))

    def into_engine(self, engine, cfg: Config) -> dict:
        return read_client_state(self.path)  # the weights are in the model already


class EngineLoad(Start):
    """A tag DeepSpeed's load_checkpoint restores into the engine: its weights and optimizer state."""

    def engine_tag(self) -> tuple[Path, str]:
        """The folder and the tag in it that DeepSpeed loads."""
        return self.folder, self.tag

    def into_engine(self, engine, cfg: Config) -> dict:
        folder, tag = self.engine_tag()
        # The optimizer's hyperparameters come from this run's config (DeepSpeed's ZeRO-3 universal
        # load would give every parameter group the first group's weight decay); the LR is set per step.
        groups = [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups]
        try:
            with safe_load.weights_only_loads():  # whichever files DeepSpeed picks, none runs code
                _, client_state = engine.load_checkpoint(str(folder), tag=tag, load_optimizer_states=True,
                                                         load_lr_scheduler_states=False)
        except RuntimeError as err:  # load_state_dict's size mismatch or missing keys
            if self.changed_settings(cfg) or "state_dict" in str(err):
                raise self.misfit(cfg, err) from None
            raise
        if client_state is None:
            raise RuntimeError(f"{self.path}: DeepSpeed could not load this checkpoint")
        for group, settings in zip(engine.optimizer.param_groups, groups):
            group.update(settings)
        return client_state


class Native(EngineLoad):
    """A tag whose optimizer state DeepSpeed's own load restores under this launch's layout."""

    how = "native"

    @classmethod
    def choose(cls, launch: StartContext) -> Start | None:
        found = launch.checkpoint
        if found is None or not found.load_optimizer or not found.saved.loads_natively_into(launch.now):
            return None
        return cls(**found.keywords())


class Universal(EngineLoad):
    """A tag with its optimizer state, saved under another layout: converted once, then loaded from
    `<tag>/universal` by an engine told load_universal."""

    how = "universal"
    loads_universal = True

    @classmethod
    def choose(cls, launch: StartContext) -> Start | None:
        found, now = launch.checkpoint, launch.now
        if found is None or not found.load_optimizer or found.saved.loads_natively_into(now):
            return None
        saved = found.saved
        if saved.plain_optimizer or now.plain_optimizer:
            raise RunRefused(
                f"{found.path}: saved under ZeRO-{saved.zero_stage} {saved.precision} on "
                f"{saved.world_size} processes, loading under ZeRO-{now.zero_stage} {now.precision} on "
                f"{now.world_size}: a plain (ZeRO-0, not bf16) optimizer state converts only to another plain one. "
                "Keep both sides plain, or set checkpoint.load_optimizer=false to start the optimizer afresh")
        return cls(**found.keywords())

    def before_engine(self, model: torch.nn.Module, cfg: Config, rank: int, log) -> None:
        """Rank 0 converts the tag (once: a conversion its manifest vouches for is reused); every rank
        fails together instead of waiting for a rank that failed."""
        error = None
        if rank == 0:
            try:
                to_universal(self.path, log=log)
            except (RuntimeError, OSError) as err:
                error = str(err)
        shared = [error]
        dist.broadcast_object_list(shared, src=0)
        if shared[0]:
            raise RunStopped(shared[0])

    def engine_tag(self) -> tuple[Path, str]:
        return self.path, UNIVERSAL


def find_source(cfg: Config, world_size: int, tag: str | None) -> Start | None:
    """The start of this launch from the first kind that applies; None for a fresh start.
    `tag` is this run's own tag to resume from (handoff.read_own_start, chosen by rank 0)."""
    launch = StartContext(cfg, world_size, tag)
    for kind in Start.KINDS:
        start = kind.choose(launch)
        if start is not None:
            return start
    if launch.load_path is not None:
        raise FileNotFoundError(f"checkpoint.load={launch.load_path}: not a checkpoints folder (no '{LATEST}' file), "
                                f"a tag folder of one, or a model folder ({PRETRAINED_WEIGHTS})")
    if tag is not None:  # never a fresh start over this run's own checkpoint
        raise RuntimeError(f"{checkpoint_dir(cfg) / tag}: no kind of start loads it")
    return None
