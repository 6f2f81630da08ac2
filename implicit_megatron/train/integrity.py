"""Whether a checkpoint tag is complete and readable, and which one to fall back to.

A tag is *complete* when every rank's files are present (the model-states files, the optimizer
shards of a partitioned optimizer, one rng file per rank) and every file reads back: each is a
zip archive (what torch.save writes) whose central directory is intact and whose records match
the CRC-32 written with them. That catches a file cut short by a full disk or an interrupted copy
and bytes changed on disk, before any of it is loaded. Tags are ordered by their step, so
"the previous complete checkpoint" is the newest complete tag with a smaller step.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import torch

LATEST = "latest"
MODEL_STATES = "mp_rank_00_model_states.pt"  # ZeRO 0-2; ZeRO-3 writes one per rank:
ZERO3_MODEL_STATES = "zero_pp_rank_0_mp_rank_00_model_states.pt"
CHUNK = 1 << 24


class DamagedCheckpoint(ValueError):
    """A checkpoint file that is missing, cut short or changed; names the file and the problem."""

    def __init__(self, file: Path, problem: str) -> None:
        super().__init__(f"{file}: {problem}; the checkpoint {file.parent.name} is incomplete or corrupt")
        self.file, self.problem = file, problem


def step_of(tag: str) -> int | None:
    match = re.search(r"(?:^|-)step(\d+)$", tag)
    return int(match.group(1)) if match else None


def read_latest(folder: Path) -> str | None:
    """The tag `latest` names; None when there is no `latest`. A `latest` that is not one line of a
    tag name (stray bytes, an empty file) is refused by name."""
    path = folder / LATEST
    if not path.is_file():
        return None
    try:
        tag = path.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        tag = ""
    if not tag or step_of(tag) is None or "/" in tag or "\n" in tag:
        raise DamagedCheckpoint(path, "does not hold a checkpoint tag name")
    return tag


def check_file(path: Path, crc: bool = True) -> None:
    """Read `path` as torch.save's zip archive and check every record's CRC-32 (with `crc`; without,
    only that the archive's directory is intact and every record lies inside the file)."""
    if not path.is_file():
        raise DamagedCheckpoint(path, "is missing")
    try:
        with zipfile.ZipFile(path) as archive:
            size = path.stat().st_size
            for info in archive.infolist():
                if info.header_offset + info.compress_size > size:
                    raise zipfile.BadZipFile(f"record {info.filename} ends past the end of the file")
                if not crc or (info.CRC == 0 and info.file_size > 0):
                    continue  # written with torch's CRC-32 switched off: only the structure is checked
                with archive.open(info) as record:
                    while record.read(CHUNK):
                        pass
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        raise DamagedCheckpoint(path, f"does not read back ({err})") from None


def expected_files(tag_dir: Path, crc: bool = True) -> list[Path]:
    """Every file a tag written by this trainer must hold, from what its model-states file records
    (checked and read here, and listed first)."""
    states = tag_dir / MODEL_STATES if (tag_dir / MODEL_STATES).is_file() else tag_dir / ZERO3_MODEL_STATES
    if not states.is_file():
        raise DamagedCheckpoint(tag_dir / MODEL_STATES, "is missing")
    check_file(states, crc)
    try:
        saved = torch.load(states, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means the same to the user
        raise DamagedCheckpoint(states, f"does not load ({type(err).__name__}: {err})") from None
    if not isinstance(saved, dict) or "config" not in saved:
        raise DamagedCheckpoint(states, "holds no run config (not written by implicit_megatron.train)")
    world, stage = int(saved.get("dp_world_size", 1)), int(saved["config"]["distributed"]["zero_stage"])
    files = [states]  # first: it has been checked here already
    if states.name == ZERO3_MODEL_STATES:
        files += [tag_dir / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(1, world)]
    files += [tag_dir / f"rng_rank{r}.pt" for r in range(world)]
    optim = sorted(tag_dir.glob("*_optim_states.pt"))
    if stage >= 1 or optim:  # partitioned optimizers (and bf16's) write one shard per rank
        prefix = "bf16_" if optim and optim[0].name.startswith("bf16_") else ""
        files += [tag_dir / f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)]
    return files


def check_tag(tag_dir: Path, crc: bool = True) -> None:
    """Raise DamagedCheckpoint naming the first file of `tag_dir` that is missing or unreadable."""
    if not tag_dir.is_dir():
        raise DamagedCheckpoint(tag_dir, "is missing")
    for path in expected_files(tag_dir, crc)[1:]:
        check_file(path, crc)


def tags_by_step(folder: Path) -> list[str]:
    """The tag folders of a checkpoints folder, newest step first."""
    tags = [p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")
            and step_of(p.name) is not None] if folder.is_dir() else []
    return sorted(tags, key=lambda t: step_of(t), reverse=True)


def newest_complete(folder: Path, before: int | None = None,
                    crc: bool = True) -> tuple[str | None, list[DamagedCheckpoint]]:
    """The newest complete tag (with a step below `before` if given) and the damage met on the way."""
    damaged = []
    for tag in tags_by_step(folder):
        if before is not None and step_of(tag) >= before:
            continue
        try:
            check_tag(folder / tag, crc)
            return tag, damaged
        except DamagedCheckpoint as err:
            damaged.append(err)
    return None, damaged


def fallback_hint(folder: Path, tag: str) -> str:
    """Names the checkpoint a user can fall back to instead of `tag`."""
    previous, _ = newest_complete(folder, before=step_of(tag))
    if previous is None:
        return f"no complete checkpoint older than {tag} is in {folder}"
    return f"the previous complete checkpoint is {folder / previous} (--tag {previous})"


def require_complete(folder: Path, tag: str) -> str:
    """`tag`, when every file of it reads back; otherwise an error naming the damaged file and the
    checkpoint to use instead."""
    try:
        check_tag(folder / tag)
    except DamagedCheckpoint as err:
        raise DamagedCheckpoint(err.file, f"{err.problem}; {fallback_hint(folder, tag)}") from None
    return tag
