"""Whether a checkpoint tag is complete and readable, and which one to fall back to.

A tag is *complete* when every rank's files are present (the model-states files, the optimizer
shards of a partitioned optimizer, one rng file per rank) and every file reads back: it has the
size and digest its `manifest.json` records (written by the save once every rank has written),
and its data matches the CRC-32 torch.save wrote with each zip record (tags saved before
manifests existed are checked by those CRC-32s alone).
That catches a file cut short by a full disk or an interrupted copy, one copied from another
checkpoint, and bytes changed on disk, before any of it is loaded. A tag holds its own files only:
a symbolic link anywhere in it (which could bring in files from elsewhere, vouched for by nobody),
or a file its save did not write (DeepSpeed's loaders pick files by pattern and unpickle them in
full), is refused by name. Tags are ordered by their step, so
"the previous complete checkpoint" is the newest complete tag with a smaller step.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path
from typing import cast

import torch

from implicit_megatron.checkpoints import safe_load
from implicit_megatron.checkpoints.layout import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    UNIVERSAL,
    UNIVERSAL_TMP,
    DamagedCheckpoint,
    step_of,
    tags_by_step,
)
from implicit_megatron.checkpoints.weights_file import nonfinite_count
from implicit_megatron.deepspeed_internals import (
    MODEL_STATES,
    UNIVERSAL_NOTE,
    ZERO3_MODEL_STATES,
    optim_states_file,
    zero3_model_states_file,
)
from implicit_megatron.utils.own_files import foreign_entry
from implicit_megatron.utils.received_file import UnreadableFile, read_small_json
from implicit_megatron.utils.safe_write import replace_text

CHUNK = 1 << 24


def refuse_foreign_entries(folder: Path) -> None:
    """Raise UnsafeCheckpoint when `folder` holds anything but its own plain files and folders."""
    found = foreign_entry(folder)
    if found:
        raise safe_load.UnsafeCheckpoint(f"{found}: refused: a checkpoint holds its own files only, and a link "
                                         "could bring in files that nothing checked (or that run code when loaded); "
                                         "replace it with the file itself")


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
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, zlib.error) as err:
        raise DamagedCheckpoint(path, f"does not read back ({err})") from None  # NotImplementedError: a
        # record's compression method garbled into one zipfile does not know


def expected_files(tag_dir: Path, crc: bool = True) -> list[Path]:
    """Every file a tag written by this trainer must hold, from what its model-states file records
    (checked and read here, and listed first)."""
    states = tag_dir / MODEL_STATES if (tag_dir / MODEL_STATES).is_file() else tag_dir / ZERO3_MODEL_STATES
    if not states.is_file():
        raise DamagedCheckpoint(tag_dir / MODEL_STATES, "is missing")
    check_file(states, crc)
    try:
        saved = safe_load.load(states, map_location="cpu", mmap=True)
    except safe_load.UnsafeCheckpoint:
        raise
    except Exception as err:  # noqa: BLE001 - any unpickling failure means the same to the user
        raise DamagedCheckpoint(states, f"does not load ({type(err).__name__}: {err})") from None
    if not isinstance(saved, dict) or "config" not in saved:
        raise DamagedCheckpoint(states, "holds no run config (not written by implicit_megatron.train)")
    distributed = saved["config"]["distributed"]
    world, stage = int(saved.get("dp_world_size", 1)), int(distributed["zero_stage"])
    files = [states]  # first: it has been checked here already
    if states.name == ZERO3_MODEL_STATES:
        files += [tag_dir / zero3_model_states_file(r) for r in range(1, world)]
    files += [tag_dir / f"rng_rank{r}.pt" for r in range(world)]
    if stage >= 1:  # partitioned optimizers write one shard per rank, named as DeepSpeed names them on save
        bf16 = distributed.get("precision") == "bf16"  # and load: by the engine's precision
        files += [tag_dir / optim_states_file(r, bf16) for r in range(world)]
    return files


def refuse_stray_files(tag_dir: Path, expected: list[Path]) -> None:
    """UnsafeCheckpoint naming the first entry of `tag_dir` that is not one of its `expected` files,
    its manifest or its universal conversion (checked where used). DeepSpeed's loaders pick their
    files by pattern (every model-states file, an optimizer prefix) and unpickle them in full: a file
    planted beside a tag's own would be read, and could run code."""
    own = {p.name for p in expected} | {MANIFEST}
    for entry in sorted(tag_dir.iterdir()):
        if entry.name in own or (entry.name in (UNIVERSAL, UNIVERSAL_TMP) and entry.is_dir()) or \
                (entry.name == UNIVERSAL_NOTE and entry.is_file() and entry.stat().st_size < 256):
            continue
        raise safe_load.UnsafeCheckpoint(
            f"{entry}: refused: not one of the files this checkpoint's save wrote (its manifest, model states, "
            f"optimizer shards and random states: {len(own)} files, named for its saved layout), and DeepSpeed's "
            "loaders would read it; remove it (nothing of the checkpoint is lost)")


def first_nonfinite(path: Path) -> str | None:
    """Where the first floating-point tensor of `path` holding NaN or infinity is, and how many such
    values it holds (None: every value is finite). Weights that are not finite train nothing (every
    step is skipped), so such a checkpoint is as good as damaged."""
    state = safe_load.load(path, map_location="cpu", mmap=True)
    pending = [("", state)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, torch.Tensor):
            bad = nonfinite_count(value)
            if bad:
                return f"{where.lstrip('.') or 'its tensor'} ({bad} of {value.numel()} values)"
        elif isinstance(value, dict):
            pending += [(f"{where}.{key}", item) for key, item in reversed(list(value.items()))]
        elif isinstance(value, (list, tuple)):
            pending += [(f"{where}[{i}]", item) for i, item in reversed(list(enumerate(value)))]
    return None


def file_crc32(path: Path) -> int:
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            value = zlib.crc32(chunk, value)
    return value


def digest(path: Path) -> str:
    """A file's checksum without reading its data where it is torch.save's zip archive: the CRC-32 of
    the archive's directory (every record's name, size and the CRC-32 torch wrote with it); check_file
    then proves the data matches that directory. Other files: the CRC-32 of their bytes."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = sorted((i.filename, i.file_size, i.CRC) for i in archive.infolist())
        return f"zip-{zlib.crc32(json.dumps(entries).encode()):08x}"
    except (zipfile.BadZipFile, ValueError, NotImplementedError):  # no zip, or a directory garbled past reading
        return f"crc32-{file_crc32(path):08x}"


def write_manifest(tag_dir: Path, val_loss: float | None = None) -> None:
    """What the tag holds: every file's size and digest, written once all ranks have saved; reads
    the zip directories only, not the data. `val_loss`: the validation loss of these weights, where
    an evaluation ran at this step (pruning keeps the best)."""
    files = sorted(p for p in tag_dir.rglob("*") if p.is_file() and p.name != MANIFEST)
    record = {str(p.relative_to(tag_dir)): {"size": p.stat().st_size, "digest": digest(p)} for p in files}
    extra = {} if val_loss is None else {"val_loss": val_loss}
    (tag_dir / MANIFEST).write_text(json.dumps({"version": 1, "files": record, **extra}, indent=1) + "\n")


def record_universal(tag_dir: Path, universal: Path) -> None:
    """Add the files of the tag's universal conversion to its manifest: what vouches for them."""
    refuse_foreign_entries(universal)
    manifest = read_manifest(tag_dir)
    files = sorted(p for p in universal.rglob("*") if p.is_file())
    manifest["universal"] = {str(p.relative_to(universal)): {"size": p.stat().st_size, "digest": digest(p)}
                             for p in files}
    replace_text(tag_dir / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def unvouched_universal(tag_dir: Path, universal: Path) -> str | None:
    """Why the tag's universal folder is not the one this project converted and recorded (None when
    it is): not in the manifest, files added, missing or changed, or a file that would not load with
    the weights-only unpickler (DeepSpeed loads these files with the full one, which runs code)."""
    try:
        listed = read_manifest(tag_dir).get("universal")
    except DamagedCheckpoint:
        listed = None
    if not isinstance(listed, dict) or not all(isinstance(r, dict) and {"size", "digest"} <= r.keys()
                                               for r in listed.values()):
        return f"the manifest of {tag_dir.name} does not record it (no conversion of this project wrote it)"
    found = foreign_entry(universal)
    if found:
        return f"{found} (a conversion holds its own files only)"
    present = {str(p.relative_to(universal)): p for p in universal.rglob("*") if p.is_file()}
    if set(present) != set(listed):
        extra, missing = sorted(set(present) - set(listed)), sorted(set(listed) - set(present))
        return f"its files differ from those recorded (not recorded: {extra[:3]}, missing: {missing[:3]})"
    for name, path in present.items():
        if path.stat().st_size != listed[name]["size"] or digest(path) != listed[name]["digest"]:
            return f"{name} changed since its conversion"
        problem = safe_load.weights_only_problem(path)
        if problem:
            return f"{name} would run code when loaded ({problem})"
    return None


def read_manifest(tag_dir: Path) -> dict:
    """A tag's manifest: {"files": {name: {"size": int, "digest": str}}, ...}; DamagedCheckpoint
    naming it where it is no such object (cut, garbled, nested past reason, not a regular file)."""
    path = tag_dir / MANIFEST
    try:
        manifest = read_small_json(path, MAX_MANIFEST_BYTES, "a checkpoint's manifest")
    except UnreadableFile as err:
        raise DamagedCheckpoint(path, f"does not read back ({str(err).removeprefix(f'{path}: ')})") from None
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(listed, dict) or not all(
            isinstance(name, str) and isinstance(record, dict) and type(record.get("size")) is int
            and isinstance(record.get("digest"), str) for name, record in listed.items()):
        raise DamagedCheckpoint(path, 'does not read back (expected {"files": {NAME: {"size": int, "digest": str}}})')
    return manifest


def check_manifest(tag_dir: Path, crc: bool) -> dict:
    """Every file the manifest lists is there with its size and digest, and with `crc` its data
    matches (a full read): a partly copied, swapped, truncated or changed file is named. Returns
    the listing."""
    listed = read_manifest(tag_dir)["files"]
    for name, record in listed.items():
        path = tag_dir / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise safe_load.UnsafeCheckpoint(f"{tag_dir / MANIFEST}: lists {name}, outside the checkpoint")
        if not path.is_file():
            raise DamagedCheckpoint(path, "is missing")
        if path.stat().st_size != record["size"]:
            raise DamagedCheckpoint(path, f"is {path.stat().st_size} bytes, the manifest says {record['size']} "
                                          "(cut short or partly copied)")
        if record["digest"] != digest(path):
            raise DamagedCheckpoint(path, "does not match its checksum in the manifest (another file, or changed "
                                          "since it was saved)")
        if crc and record["digest"].startswith("zip-"):
            check_file(path, crc=True)  # the data against the directory the digest covers
    return listed


def check_tag(tag_dir: Path, crc: bool = True) -> None:
    """Raise DamagedCheckpoint naming the first file of `tag_dir` that is missing, cut short or changed
    (against the tag's manifest; for tags saved without one, from the files' own zip CRCs), or that
    holds a tensor with NaN or infinity (with `crc`, the full check), and
    UnsafeCheckpoint for a file that would run code when DeepSpeed's loaders unpickle it, or for a
    symbolic link anywhere in the tag."""
    if not tag_dir.is_dir():
        raise DamagedCheckpoint(tag_dir, "is missing")
    refuse_foreign_entries(tag_dir)
    listed = check_manifest(tag_dir, crc) if (tag_dir / MANIFEST).is_file() else None
    files = expected_files(tag_dir, crc and listed is None)
    refuse_stray_files(tag_dir, files)
    for path in files[1:]:
        if listed is None:
            check_file(path, crc)
        elif str(path.relative_to(tag_dir)) not in listed:
            raise DamagedCheckpoint(path, "is not in the checkpoint's manifest")
        if crc:  # the full check, made before anything is loaded
            safe_load.verify(path)
    for path in files if crc else []:
        nonfinite = first_nonfinite(path)
        if nonfinite:
            raise DamagedCheckpoint(path, f"holds values that are not finite (NaN or inf) in {nonfinite}")


def newest_complete(folder: Path, before: int | None = None,
                    crc: bool = True) -> tuple[str | None, list[DamagedCheckpoint]]:
    """The newest complete tag (with a step below `before` if given) and the damage met on the way."""
    damaged: list[DamagedCheckpoint] = []
    for tag in tags_by_step(folder):
        if before is not None and cast(int, step_of(tag)) >= before:
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
