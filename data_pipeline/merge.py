"""Merge the per-input partial files of one split into its final shards, in input order.

Each final file is written under a temporary name and renamed only when complete, so a reader
never sees a half-written shard and an interrupted merge simply runs again.  Documents are copied
as byte ranges (what megatron-core's `add_index` does for whole files, without its per-file
garbage collection, which costs a quarter of a second each once torch is loaded).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from data_pipeline.indexed import (
    HashingWriter,
    append_document_range,
    document_lengths,
    existing_outputs,
    finalize,
    megatron_indexed,
    split_prefix,
)
from data_pipeline.shard_check import file_sha256

TMP = ".tmp"
UNCAPPED = 2**62  # tokens: one shard per split


@dataclass
class MergedSplit:
    """The shard prefixes of one split and, by file name, each file's size and sha256 (`_stats.json`
    records them: `python -m data_pipeline.shard_check --verify` compares)."""

    shards: list[str] = field(default_factory=list)
    files: dict[str, dict] = field(default_factory=dict)


class _ShardSequence:
    """Final shards of one split, opened one at a time; renamed into place by `publish`."""

    def __init__(self, prefix: str, split: str, dtype: type[np.integer], sharded: bool) -> None:
        self.prefix, self.split, self.dtype, self.sharded = prefix, split, dtype, sharded
        self.done: list[str] = []
        self.files: dict[str, dict] = {}
        self.builder = None
        self.tokens = 0

    def current(self):
        if self.builder is None:
            _, builder_cls = megatron_indexed()
            name = self._name(len(self.done))
            self.builder = builder_cls(name + ".bin" + TMP, dtype=self.dtype)
            self.builder.data_file = HashingWriter(self.builder.data_file)
        return self.builder

    def close_current(self) -> None:
        if self.builder is not None:
            name = self._name(len(self.done))
            written = self.builder.data_file
            finalize(self.builder, name + ".idx" + TMP)
            base = os.path.basename(name)
            self.files[base + ".bin"] = {"bytes": written.bytes, "sha256": written.sha.hexdigest()}
            self.files[base + ".idx"] = {"bytes": os.path.getsize(name + ".idx" + TMP),
                                         "sha256": file_sha256(name + ".idx" + TMP)}  # small: 12 bytes a document
            self.done.append(name)
            self.builder = None
            self.tokens = 0

    def publish(self) -> list[str]:
        """Rename every finished shard to its final name; returns the shard prefixes (none when empty)."""
        self.close_current()
        for name in self.done:
            os.replace(name + ".bin" + TMP, name + ".bin")
            os.replace(name + ".idx" + TMP, name + ".idx")
        return self.done

    def discard(self) -> None:
        """Remove the temporary files of this split's shards (finished or not)."""
        names = [*self.done, self._name(len(self.done))]
        self.builder = None
        for name in names:
            for ext in (".bin", ".idx"):
                if os.path.exists(name + ext + TMP):
                    os.remove(name + ext + TMP)

    def _name(self, k: int) -> str:
        return split_prefix(self.prefix, self.split, k if self.sharded else None)


def merge_split(parts: list[str], prefix: str, split: str, dtype: type[np.integer],
                max_shard_tokens: int | None) -> MergedSplit:
    """Concatenate `parts` (partial-file prefixes) into `{prefix}_{split}[_{k:05d}]`.

    With `max_shard_tokens`, a shard is closed before a document that would overflow it (a single
    longer document gets a shard of its own); documents are never cut.  A split without documents
    gets no file (megatron-core cannot map an empty one).
    """
    for stale in existing_outputs(prefix, split):  # left by an interrupted earlier merge
        os.remove(stale)
    cap = max_shard_tokens or UNCAPPED
    shards = _ShardSequence(prefix, split, dtype, sharded=max_shard_tokens is not None)
    try:
        _copy_documents(parts, shards, cap)
        return MergedSplit(shards.publish(), shards.files)
    except BaseException:  # a full disk, an interrupt: no half-written file is left behind
        shards.discard()
        raise


def _copy_documents(parts: list[str], shards: _ShardSequence, cap: int) -> None:
    """Copy every document of `parts` once, in order, each into the open shard while it fits under
    `cap`. Every round either copies at least one document (`start` grows) or closes a shard that
    holds tokens, after which the next round copies: the loop ends after at most two rounds per
    document, and writes exactly the parts' tokens."""
    for part in parts:
        lengths = document_lengths(part)
        ends = np.cumsum(lengths)  # ends[i]: tokens up to and including document i
        start = 0
        while start < len(lengths):
            before = int(ends[start - 1]) if start else 0
            room = cap - shards.tokens  # below zero after a document longer than the cap
            stop = max(start, int(np.searchsorted(ends, before + room, side="right")))
            if stop == start:  # the next document does not fit
                if shards.tokens == 0:  # longer than the cap: a shard of its own
                    stop = start + 1
                else:
                    shards.close_current()
                    continue
            append_document_range(shards.current(), part, lengths, start, stop, before)
            shards.tokens += int(ends[stop - 1]) - before
            start = stop
