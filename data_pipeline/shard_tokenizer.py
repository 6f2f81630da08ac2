"""Whether a prefix's shards were built with a given tokenizer.

Preprocessing records the tokenizer in `{prefix}_stats.json`: its identity (what it does,
`Tokenizer.identity`), its file's absolute path and sha256. Token ids mean nothing without their
tokenizer: training (the pre-launch check) and evaluation refuse shards built with another one,
naming both files. The identity is what is compared: the export's decompressed, re-serialized
`tokenizer.json` is the tokenizer the shards were built with, wherever either lies and from any
working directory. Stats written before the identity (no "tokenizer_identity") are compared as they
were: by the file's sha256, else by vocabulary with the recorded file, found where it lies.
"""

from __future__ import annotations

from pathlib import Path

from data_pipeline.shard_check import file_sha256, read_stats
from data_pipeline.tokenizer import Tokenizer, load_tokenizer

REPOSITORY = Path(__file__).resolve().parents[1]  # older stats name the bundled tokenizers relative to it


def other_tokenizer(prefix: str, tokenizer: str) -> str | None:
    """Why the shards at `prefix` were not built with `tokenizer` (None: they were, or their stats
    record nothing to compare with)."""
    stats_path = Path(f"{prefix}_stats.json")
    stats = tokenizer_record(read_stats(prefix))  # a stats file that is no JSON object: ShardError naming it
    if stats is None:
        return None  # no stats, or an older or foreign stats file: nothing recorded to compare
    ours = load_tokenizer(tokenizer)
    if matches_record(stats, ours):
        return None
    if "tokenizer_identity" not in stats and _same_vocabulary(stats, stats_path, ours):
        return None
    built_with = stats.get("tokenizer", "a tokenizer it does not name")
    return (f"{tokenizer} ({_digest_of(ours, stats)}) is not the tokenizer the shards {prefix}_* were built with: "
            f"{stats_path} names {built_with} ({_recorded_digest(stats)}), whose token ids mean other tokens")


def tokenizer_record(stats: object) -> dict | None:
    """The stats' tokenizer entries with a value of the right type (a received file's others are
    dropped); None where nothing comparable is recorded."""
    if not isinstance(stats, dict):
        return None
    record = {key: stats[key] for key in ("tokenizer", "tokenizer_sha256", "tokenizer_identity")
              if isinstance(stats.get(key), str)}
    comparable = "tokenizer_identity" in record or {"tokenizer", "tokenizer_sha256"} <= record.keys()
    return record if comparable else None


def matches_record(record: dict, ours: Tokenizer) -> bool:
    """The recorded file itself (its sha256: the same file, whatever a later tokenizers release
    writes of it), or where an identity is recorded, the same identity."""
    if record.get("tokenizer_sha256") == file_sha256(ours.path):
        return True
    return "tokenizer_identity" in record and record["tokenizer_identity"] == ours.identity()


def _same_vocabulary(record: dict, stats_path: Path, ours: Tokenizer) -> bool:
    """Older stats: the recorded file, where it is found, has our vocabulary."""
    found = recorded_file(record.get("tokenizer", ""), stats_path)
    if found is None:
        return False
    try:
        return load_tokenizer(found).vocabulary() == ours.vocabulary()
    except (OSError, ValueError):
        return False  # not a tokenizer we can read: nothing to compare vocabularies with


def recorded_file(name: str, stats_path: Path) -> Path | None:
    """The file older stats name: as named (from here), else a relative name beside the stats file
    or in the repository (preprocessing run from its root names `data/tokenizers/...`)."""
    path = Path(name)
    if not name:
        return None
    places = [path] if path.is_absolute() else [path, stats_path.parent / path, REPOSITORY / path]
    return next((place for place in places if place.is_file()), None)


def _digest_of(ours: Tokenizer, record: dict) -> str:
    if "tokenizer_identity" in record:
        return f"identity {ours.identity()[:12]}"
    return f"sha256 {file_sha256(ours.path)[:12]}"


def _recorded_digest(record: dict) -> str:
    if "tokenizer_identity" in record:
        return f"identity {record['tokenizer_identity'][:12]}"
    return f"sha256 {record['tokenizer_sha256'][:12]}"
