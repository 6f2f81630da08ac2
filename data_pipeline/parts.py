"""Per-input partial files: the unit of resumption.

Input i is written to `{prefix}.work/tmp-...` and renamed to `{prefix}.work/{i:05d}-{key}` with
a `done.json` inside only once complete.  The single writer finishes inputs strictly in order, so
the finished parts of an interrupted run are always the first inputs; a rerun reuses those and
streams every other input through the workers without pausing between files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from data_pipeline.encoder import BatchResult
from data_pipeline.indexed import append_documents, finalize, megatron_indexed
from data_pipeline.plan import Plan
from data_pipeline.progress import Progress
from data_pipeline.sources import Unreadable, read_batches
from data_pipeline.splits import SPLITS
from data_pipeline.stats import Counts
from data_pipeline.workers import EncoderPool


@dataclass(frozen=True)
class InputStart:
    """Marks, in the stream of batches, where input `index` begins."""

    index: int


class PartWriter:
    """The partial train/valid/test files of one input, under a temporary name until `finish`."""

    def __init__(self, plan: Plan, index: int, documents_left: int | None) -> None:
        self.plan, self.index, self.documents_left = plan, index, documents_left
        self.final = plan.part_dir(index, documents_left)
        self.tmp = self.final.with_name(f"tmp-{self.final.name}-{os.getpid()}")
        self.tmp.mkdir()
        _, builder_cls = megatron_indexed()
        self.builders = {s: builder_cls(str(self.tmp / f"{s}.bin"), dtype=plan.dtype) for s in SPLITS}
        self.counts = Counts()

    @property
    def full(self) -> bool:
        return self.documents_left is not None and self.counts.documents >= self.documents_left

    def add(self, result: BatchResult) -> BatchResult:
        """Append a batch (cut at the document limit); returns what was kept."""
        if self.documents_left is not None:
            result = result.truncated(self.documents_left - self.counts.documents)
        for split in SPLITS:
            append_documents(self.builders[split], result.tokens[split], result.lengths[split])
        self.counts.add_batch(result)
        return result

    def finish(self) -> Path:
        for split, builder in self.builders.items():
            finalize(builder, str(self.tmp / f"{split}.idx"))
        write_json_atomic(self.tmp / "done.json", {"input": self.plan.specs[self.index].location,
                                                   "counts": self.counts.to_dict()})
        os.rename(self.tmp, self.final)
        return self.final


def reuse_finished(plan: Plan, total: Counts) -> list[Path]:
    """The parts an earlier run finished (a prefix of the inputs); their counts go into `total`."""
    parts: list[Path] = []
    for index in range(len(plan.specs)):
        left = documents_left(plan, total)
        if left == 0:
            break
        part = plan.part_dir(index, left)
        if not (part / "done.json").is_file():
            break
        total.add(Counts.from_dict(json.loads((part / "done.json").read_text())["counts"]))
        parts.append(part)
    return parts


def write_parts(plan: Plan, first: int, total: Counts, encoders: EncoderPool, progress: Progress) -> list[Path]:
    """Tokenize inputs `first`... into finished parts, in order, until the inputs or the limit end."""
    parts: list[Path] = []
    writer: PartWriter | None = None
    for item in encoders.map(_stream(plan, first)):
        if isinstance(item, InputStart):
            if writer is not None:
                parts.append(writer.finish())
                total.add(writer.counts)
            left = documents_left(plan, total)
            if left == 0:
                return parts
            writer = PartWriter(plan, item.index, left)
        elif isinstance(item, Unreadable):
            assert writer is not None  # the stream starts with an InputStart
            writer.counts.skip("unreadable_file", item.location)
            progress.warn(f"skipping the rest of {item.location}: {item.message}")
        else:
            assert writer is not None  # the stream starts with an InputStart
            progress.add_batch(writer.add(cast(BatchResult, item)))
            if writer.full:
                break
    if writer is not None:
        parts.append(writer.finish())
        total.add(writer.counts)
    return parts


def documents_left(plan: Plan, total: Counts) -> int | None:
    limit = plan.config.limit_docs
    return None if limit is None else limit - total.documents


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _stream(plan: Plan, first: int) -> Iterator[object]:
    config = plan.config
    for index in range(first, len(plan.specs)):
        yield InputStart(index)
        yield from read_batches(plan.specs[index], config.text_key, config.batch_docs, config.batch_bytes)
