"""Whether a prefix's shards were built with a given tokenizer.

Preprocessing records the tokenizer file and its sha256 in `{prefix}_stats.json`. Token ids mean
nothing without their tokenizer: training (the pre-launch check) and evaluation refuse shards built
with another one, naming both files. A different file with the same vocabulary (an uncompressed
copy, say) is the same tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

from data_pipeline.plan import file_sha256
from data_pipeline.tokenizer import load_tokenizer


def other_tokenizer(prefix: str, tokenizer: str) -> str | None:
    """Why the shards at `prefix` were not built with `tokenizer` (None: they were, or their stats
    record nothing to compare with)."""
    stats_path = Path(f"{prefix}_stats.json")
    try:
        stats = json.loads(stats_path.read_text())
        built_with, built_sha = stats["tokenizer"], stats["tokenizer_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no stats, or an older or foreign stats file: nothing recorded to compare
    ours = load_tokenizer(tokenizer)
    ours_sha = file_sha256(ours.path)
    if ours_sha == built_sha:
        return None
    try:
        if load_tokenizer(built_with).vocabulary() == ours.vocabulary():
            return None
    except (OSError, ValueError):
        pass  # the shards' tokenizer is not here to compare vocabularies with
    return (f"{tokenizer} (sha256 {ours_sha[:12]}) is not the tokenizer the shards {prefix}_* were built with: "
            f"{stats_path} names {built_with} (sha256 {built_sha[:12]}), whose token ids mean other tokens")
