"""Where a run's checkpoints live and what their files are called, read without DeepSpeed.

    {output_dir}/checkpoints/latest                one line: the newest complete tag
    {output_dir}/checkpoints/{phase}-step{N}/      a tag: DeepSpeed's files (deepspeed_internals names them),
                                                   rng_rank{r}.pt, manifest.json
    {output_dir}/checkpoints/{tag}/universal/      its universal conversion (checkpoints.universal)
    {output_dir}/checkpoints/.partial-{tag}/       a tag being written (renamed when every rank is done)

A tag is written as `.partial-{tag}` and renamed once every rank has finished; `latest` is replaced
(write, fsync, rename) after that, so a kill during a save leaves `latest` on the previous complete
tag. Every tag's model-states file carries the run's client state (config, step, data position).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from implicit_megatron.checkpoints import safe_load
from implicit_megatron.config import Config
from implicit_megatron.deepspeed_internals import MODEL_STATES, ZERO3_MODEL_STATES  # DeepSpeed's names (re-exported)
from implicit_megatron.utils.names import child_path, name_problem
from implicit_megatron.utils.received_file import UnreadableFile, read_small_file, read_small_json
from implicit_megatron.utils.safe_write import replace_text

LATEST = "latest"
MANIFEST = "manifest.json"  # every file of a tag: size and CRC-32 (checkpoints.integrity)
MAX_MANIFEST_BYTES = 64 * 2**20  # a line per file of a tag (and of its universal conversion)
UNIVERSAL = "universal"  # the sub-folder of a tag that holds its universal conversion
UNIVERSAL_TMP = f".{UNIVERSAL}.tmp"  # ... while it is written (renamed to UNIVERSAL when complete)
PARTIAL = ".partial-"  # a tag is written under this prefix and renamed when every rank has finished
PRETRAINED_WEIGHTS = "model.safetensors"  # a folder written by tools/convert_checkpoint.py export/import
RUN_ID = "run_id"  # in a checkpoints folder: the run whose checkpoints these are (see own_run_id)
HELD = "held.json"  # tags pruning must leave whatever keep_last says, and why (see hold)


class DamagedCheckpoint(ValueError):
    """A checkpoint file that is missing, cut short or changed; names the file and the problem."""

    def __init__(self, file: Path, problem: str) -> None:
        tag = next((p.name for p in (file, *file.parents) if step_of(p.name) is not None), None)
        whose = f"; the checkpoint {tag} is incomplete or corrupt" if tag else ""  # `latest` belongs to no tag
        super().__init__(f"{file}: {problem}{whose}")
        self.file, self.problem = file, problem


def step_of(tag: str) -> int | None:
    match = re.search(r"(?:^|-)step(\d+)$", tag)
    return int(match.group(1)) if match else None


def _known_step(tag: str) -> int:
    """step_of for a tag already known to name a step."""
    return cast(int, step_of(tag))


def phase_of(tag: str) -> str | None:
    match = re.match(r"(.+)-step\d+$", tag)
    return match.group(1) if match else None


def checkpoint_dir(cfg: Config) -> Path:
    return Path(cfg.output_dir) / "checkpoints"


def read_latest(folder: Path) -> str | None:
    """The tag `latest` names; None when there is no `latest`. A `latest` that is not one line of a
    tag name (stray bytes, an empty file) is refused by name."""
    path = folder / LATEST
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():
        raise DamagedCheckpoint(path, "is not a file (a folder or a link to nothing?)")
    try:
        tag = read_small_file(path, 4096, "one line of a checkpoint tag name").decode("utf-8").strip()
    except (UnreadableFile, UnicodeDecodeError):
        tag = ""
    if not tag or step_of(tag) is None or name_problem(tag):
        raise DamagedCheckpoint(path, "does not hold a checkpoint tag name")
    return tag


def tag_dir(folder: Path, tag: str) -> Path:
    """The folder of checkpoint `tag` in the checkpoints folder `folder`; ValueError for a tag that is
    not a plain name (one with '/' or '..' would reach outside `folder`)."""
    return child_path(folder, tag, "checkpoint tag")


def find_checkpoint(path: str | Path, tag: str | None = None) -> tuple[Path, str]:
    """(checkpoints folder, tag) of what a user names: a checkpoints/ folder (its `latest`, or `tag`),
    the run folder that holds one, or one tag folder; FileNotFoundError naming what is missing."""
    folder = Path(path)
    if not (folder / LATEST).is_file() and (folder / "checkpoints").is_dir():
        folder = folder / "checkpoints"  # a run folder
    if tag is None and not (folder / LATEST).is_file() and \
            any((folder / name).is_file() for name in (MODEL_STATES, ZERO3_MODEL_STATES)):
        return folder.parent, folder.name  # one tag folder
    tag = tag or read_latest(folder)
    if tag is None:
        raise FileNotFoundError(f"{path}: not a checkpoint folder (no '{LATEST}' file in it or in its checkpoints/); "
                                "name a run folder, its checkpoints/ folder or a tag folder, or a tag with --tag")
    if not tag_dir(folder, tag).is_dir():
        raise FileNotFoundError(f"{folder}: no checkpoint with tag {tag!r}")
    return folder, tag


def write_latest(folder: Path, tag: str) -> None:
    """Point `latest` at `tag` atomically (write, fsync, rename)."""
    replace_text(folder / LATEST, tag + "\n", fsync=True)


def tags_by_step(folder: Path) -> list[str]:
    """The tag folders of a checkpoints folder, newest step first."""
    tags = [p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")
            and step_of(p.name) is not None] if folder.is_dir() else []
    return sorted(tags, key=_known_step, reverse=True)


@dataclass(frozen=True)
class Layout:
    world_size: int
    zero_stage: int
    precision: str

    @property
    def plain_optimizer(self) -> bool:
        """ZeRO-0 without bf16 keeps torch's optimizer state whole, the same at every world size."""
        return self.zero_stage == 0 and self.precision != "bf16"

    def loads_natively_into(self, now: Layout) -> bool:
        """DeepSpeed's own load restores an optimizer state saved under this layout into `now`: the same
        layout, or plain optimizers on both sides."""
        return self == now or (self.plain_optimizer and now.plain_optimizer)


def model_states_file(path: Path) -> Path:
    """The file with a checkpoint tag's client state (our config, step, data position)."""
    for name in (MODEL_STATES, ZERO3_MODEL_STATES):
        if (path / name).is_file():
            return path / name
    raise FileNotFoundError(f"{path}: not a complete checkpoint (neither {MODEL_STATES} nor {ZERO3_MODEL_STATES})")


def read_client_state(path: Path) -> dict:
    """A tag's client state, memory-mapped: no tensor is read until used."""
    states = model_states_file(path)
    saved = safe_load.load(states, map_location="cpu", mmap=True)
    if "config" not in saved:
        raise ValueError(f"{states}: no run config in this checkpoint; was it written by implicit_megatron.train?")
    return saved


def saved_layout(path: Path) -> Layout:
    """The layout a checkpoint tag was written with."""
    saved = read_client_state(path)
    d = saved["config"]["distributed"]
    return Layout(int(saved.get("dp_world_size", 1)), int(d["zero_stage"]), d["precision"])


def recorded_val_loss(tag_dir: Path) -> float | None:
    """The validation loss a tag's manifest records (None: none, or no readable manifest)."""
    try:
        loss = read_small_json(tag_dir / MANIFEST, MAX_MANIFEST_BYTES, "a checkpoint's manifest").get("val_loss")
    except (UnreadableFile, AttributeError):
        return None
    return float(loss) if type(loss) in (int, float) else None


def prune(folder: Path, keep_last: int, latest: str, log=print) -> None:
    """Keep the newest `keep_last` checkpoints up to `latest` (a newer one, left behind by a fallback
    from a damaged checkpoint, is replaced when training reaches its step again), the one with
    the lowest recorded validation loss (a run that diverges keeps its best weights), and those held
    (`hold`) until a checkpoint newer than their release step exists (all, when the hold list is
    damaged: read_held)."""
    newest = _known_step(latest)
    entries = read_held(folder, log)
    if entries is None:
        return
    held = {tag for tag, entry in entries.items() if (folder / tag).is_dir() and
            (entry.get("released_at") is None or newest <= entry["released_at"])}
    write_held(folder, {tag: entry for tag, entry in entries.items() if tag in held})
    tags = sorted((folder / t for t in tags_by_step(folder) if _known_step(t) <= newest),
                  key=lambda p: _known_step(p.name))
    scored = [(loss, path) for path in tags if (loss := recorded_val_loss(path)) is not None]
    best = min(scored, key=lambda s: s[0])[1] if scored else None
    for old in tags[:-keep_last] if keep_last > 0 else []:
        if old != best and old.name not in held:
            shutil.rmtree(old, ignore_errors=True)


def own_run_id(folder: Path, adopt: str | None = None, log=print) -> str:
    """The run id of a checkpoints folder, made at its first launch (RUN_ID) and saved with every
    checkpoint, so that a tag copied in from another run is told from the run's own. A folder without
    one (written before run ids), or whose file is damaged, adopts `adopt`, the id its newest
    checkpoint records, if any (with a warning through `log` for a damaged one)."""
    path = folder / RUN_ID
    if path.is_file():
        try:
            recorded = path.read_bytes().decode("ascii").strip()
        except UnicodeDecodeError:
            recorded = ""
        if re.fullmatch(r"[0-9a-f]{32}", recorded):
            return recorded
        log(f"warning: {path} does not hold a run id (damaged?); "
            + (f"taking {adopt}, the id its newest checkpoint records" if adopt else "starting a new one"))
    run_id = adopt or uuid.uuid4().hex
    folder.mkdir(parents=True, exist_ok=True)
    replace_text(path, run_id + "\n")
    return run_id


def read_held(folder: Path, log=print) -> dict[str, dict] | None:
    """{tag: {"why": ..., "released_at": step or None}} from `folder`/HELD ({} when there is none).
    None when the file is not such a list (cut short, edited, another program's): it is moved aside,
    named in a warning through `log`, and the caller keeps every checkpoint this once."""
    path = folder / HELD
    if not path.exists():
        return {}
    try:
        held = json.loads(path.read_bytes().decode("utf-8"))
        fits = isinstance(held, dict) and all(
            not name_problem(tag) and isinstance(entry, dict) and isinstance(entry.get("why", ""), str)
            and (entry.get("released_at") is None or type(entry.get("released_at")) is int)
            for tag, entry in held.items())
    except (OSError, ValueError):
        fits = False
    if fits:
        return held
    aside = path.with_name(f"{HELD}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, aside)
    log(f"warning: {path} is not a list of held checkpoints (damaged?): moved to {aside}; no checkpoint is pruned "
        "at this save, and the checkpoints it held are held no longer")
    return None


def write_held(folder: Path, held: dict[str, dict]) -> None:
    if not held:
        (folder / HELD).unlink(missing_ok=True)
        return
    replace_text(folder / HELD, json.dumps(held, indent=1) + "\n")


def hold(folder: Path, tag: str, why: str, log=print) -> None:
    """Keep `tag` through pruning until `release` and a checkpoint after that (the checkpoint a
    diverging run names as the one to go back to must still be there when the user does)."""
    write_held(folder, {**(read_held(folder, log) or {}), tag: {"why": why, "released_at": None}})


def release(folder: Path, step: int, log=print) -> None:
    """The held tags may be pruned once a checkpoint after `step` exists (it is then known good)."""
    write_held(folder, {tag: {**entry, "released_at": entry.get("released_at") or step}
                        for tag, entry in (read_held(folder, log) or {}).items()})


def remove_partial(cfg: Config, log) -> None:
    """Remove the partial tag folders a kill during a save left (rank 0, before anything starts)."""
    folder = checkpoint_dir(cfg)
    for leftover in sorted(folder.glob(PARTIAL + "*")) if folder.is_dir() else []:
        try:
            shutil.rmtree(leftover)
        except OSError as err:
            log(f"warning: could not remove {leftover}, a checkpoint whose save was interrupted ({err}); "
                "it is never loaded")
        else:
            log(f"removed {leftover}, a checkpoint whose save was interrupted")


