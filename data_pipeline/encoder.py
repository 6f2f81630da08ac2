"""Turn one raw batch into token arrays per split: the work done in each worker process.

A worker decodes records (JSON, UTF-8), drops bad ones with a reason, hashes each good text to
its split and tokenizes the whole batch in one `encode_batch` call.  Results are flat arrays per
split (documents in input order) so that the single writer only has to append bytes.  This module
stays light (no torch, no megatron) because every spawned worker imports it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, cast

import numpy as np

from data_pipeline.sources import RawBatch
from data_pipeline.splits import SPLITS, split_of
from data_pipeline.tokenizer import Tokenizer, load_tokenizer

SKIP_REASONS = ("malformed_json", "not_an_object", "missing_text", "non_string_text", "empty_text",
                "invalid_utf8", "unreadable_file")
BLANK = "blank"  # a blank JSON line: ignored, not counted


@dataclass(frozen=True)
class EncodeSettings:
    text_key: str
    eod_id: int
    append_eod: bool
    valid_fraction: float
    test_fraction: float
    dtype: str  # numpy dtype name of the shards: "uint16" or "int32"


@dataclass
class BatchResult:
    """Tokens of one batch.  Per good document (input order): its split, byte size and record index."""

    tokens: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    doc_splits: np.ndarray  # int8 index into SPLITS
    doc_bytes: np.ndarray  # int64 UTF-8 bytes of each text
    doc_items: np.ndarray  # int64 index of each document's record in the batch
    skipped: list[tuple[int, str, str]] = field(default_factory=list)  # (record index, reason, location)
    cpu_seconds: float = 0.0  # CPU time the encoding process spent on this batch

    @property
    def documents(self) -> int:
        return len(self.doc_splits)

    def truncated(self, keep: int) -> BatchResult:
        """The first `keep` documents (and the skips before the last of them), for --limit-docs."""
        if keep >= self.documents:
            return self
        last_item = int(self.doc_items[keep - 1]) if keep else -1
        kept = self.doc_splits[:keep]
        tokens, lengths = {}, {}
        for index, split in enumerate(SPLITS):
            count = int(np.count_nonzero(kept == index))
            lengths[split] = self.lengths[split][:count]
            tokens[split] = self.tokens[split][: int(lengths[split].sum())]
        return BatchResult(tokens, lengths, kept, self.doc_bytes[:keep], self.doc_items[:keep],
                           [s for s in self.skipped if s[0] < last_item], self.cpu_seconds)


def decode_record(item: Any, json_line: bool, text_key: str) -> tuple[str | None, str | None]:
    """(text, None) for a usable record, else (None, skip reason); (None, BLANK) for a blank line.

    `item` is a raw JSON line (bytes) when `json_line`, else the text field's value."""
    if json_line:
        if not item.strip():
            return None, BLANK
        try:
            line = item.decode("utf-8")
        except UnicodeDecodeError:
            return None, "invalid_utf8"
        try:
            record = json.loads(line)
        except ValueError:
            return None, "malformed_json"
        if not isinstance(record, dict):
            return None, "not_an_object"
        item = record.get(text_key)
    if isinstance(item, bytes):  # a binary column
        try:
            item = item.decode("utf-8")
        except UnicodeDecodeError:
            return None, "invalid_utf8"
    if item is None:
        return None, "missing_text"
    if not isinstance(item, str):
        return None, "non_string_text"
    if not item.strip():
        return None, "empty_text"
    return item, None


def encode_batch(tokenizer: Tokenizer, settings: EncodeSettings, batch: RawBatch) -> BatchResult:
    """Decode, route and tokenize one batch; bad records become (index, reason, location) entries."""
    started = time.process_time()
    items = batch.records()
    json_lines = batch.kind == "chunk"
    texts: list[str] = []
    doc_splits: list[int] = []
    doc_bytes: list[int] = []
    doc_items: list[int] = []
    skipped: list[tuple[int, str, str]] = []
    split_index = {name: i for i, name in enumerate(SPLITS)}
    for i, item in enumerate(items):
        text, reason = decode_record(item, json_lines, settings.text_key)
        if text is not None:
            try:
                raw = text.encode("utf-8")
            except UnicodeEncodeError:  # lone surrogates from JSON escapes
                text, reason = None, "invalid_utf8"
        if text is None:
            if reason != BLANK:
                skipped.append((i, cast(str, reason), batch.location(i)))  # a reason with no text
            continue
        texts.append(text)
        split = batch.split or split_of(raw, settings.valid_fraction, settings.test_fraction)
        doc_splits.append(split_index[split])
        doc_bytes.append(len(raw))
        doc_items.append(i)
    ids = tokenizer.encode_batch(texts) if texts else []
    if settings.append_eod:
        for doc in ids:
            doc.append(settings.eod_id)
    splits = np.array(doc_splits, dtype=np.int8)
    tokens, lengths = {}, {}
    for index, split in enumerate(SPLITS):
        docs = [doc for doc, s in zip(ids, doc_splits) if s == index]
        lengths[split] = np.fromiter(map(len, docs), dtype=np.int32, count=len(docs))
        tokens[split] = np.fromiter(chain.from_iterable(docs), dtype=settings.dtype,
                                    count=int(lengths[split].sum()))
    return BatchResult(tokens, lengths, splits, np.array(doc_bytes, dtype=np.int64),
                       np.array(doc_items, dtype=np.int64), skipped, time.process_time() - started)


# ------------------------------------------------------------------ worker-process entry points

_WORKER: tuple[Tokenizer, EncodeSettings] | None = None
_LAST_CPU = [0.0]  # this worker's CPU time at its previous result


def init_worker(tokenizer_path: str, eod_token: str | None, settings: EncodeSettings,
                feeder: int | None = None) -> None:
    """Pool initializer: one tokenizer per process, single-threaded (the pool is the parallelism);
    the worker ends itself when `feeder` (the process that started the pool) is gone."""
    global _WORKER
    if feeder is not None:
        from data_pipeline.processes import exit_when_gone

        exit_when_gone(feeder)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = (load_tokenizer(tokenizer_path, eod_token), settings)
    _LAST_CPU[0] = time.process_time()


def encode_in_worker(batch: RawBatch) -> BatchResult:
    """Encode in a pool worker; `cpu_seconds` counts all of this process's CPU since its previous
    result (receiving and unpacking tasks, sending results), not just the encoding."""
    tokenizer, settings = cast("tuple[Tokenizer, EncodeSettings]", _WORKER)  # set by init_worker
    result = encode_batch(tokenizer, settings, batch)
    now = time.process_time()
    result.cpu_seconds, _LAST_CPU[0] = now - _LAST_CPU[0], now
    return result
