"""Counts of a preprocessing run: documents, tokens, bytes and skipped records by reason.

One `Counts` is kept per input (saved with its finished partial files, so a resumed run still
reports the whole job) and the per-input counts are added up, in input order, for the final
`{prefix}_stats.json`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from data_pipeline.encoder import BatchResult
from data_pipeline.splits import SPLITS

EXAMPLES_PER_REASON = 5


@dataclass
class Counts:
    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    split_documents: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    split_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    skipped: dict[str, int] = field(default_factory=dict)
    skipped_examples: dict[str, list[str]] = field(default_factory=dict)
    encode_cpu_seconds: float = 0.0  # CPU time of the tokenizing processes (contention-free cost)

    def skip(self, reason: str, location: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        examples = self.skipped_examples.setdefault(reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append(location)

    def add_batch(self, result: BatchResult) -> None:
        for _, reason, location in result.skipped:
            self.skip(reason, location)
        self.documents += result.documents
        self.bytes += int(result.doc_bytes.sum())
        self.encode_cpu_seconds += result.cpu_seconds
        for split in SPLITS:
            tokens = len(result.tokens[split])
            self.tokens += tokens
            self.split_tokens[split] += tokens
            self.split_documents[split] += len(result.lengths[split])

    def add(self, other: Counts) -> None:
        self.documents += other.documents
        self.tokens += other.tokens
        self.bytes += other.bytes
        self.encode_cpu_seconds += other.encode_cpu_seconds
        for split in SPLITS:
            self.split_documents[split] += other.split_documents[split]
            self.split_tokens[split] += other.split_tokens[split]
        for reason, count in other.skipped.items():
            self.skipped[reason] = self.skipped.get(reason, 0) + count
            examples = self.skipped_examples.setdefault(reason, [])
            examples.extend(other.skipped_examples.get(reason, [])[: EXAMPLES_PER_REASON - len(examples)])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Counts:
        known = {f.name for f in fields(cls)}  # done.json of an older version may hold more
        return cls(**{key: value for key, value in data.items() if key in known})

    def minus(self, earlier: Counts) -> Counts:
        """The documents, tokens and bytes added since `earlier` (for throughput only)."""
        return Counts(documents=self.documents - earlier.documents, tokens=self.tokens - earlier.tokens,
                      bytes=self.bytes - earlier.bytes,
                      encode_cpu_seconds=self.encode_cpu_seconds - earlier.encode_cpu_seconds)


def throughput(work: Counts, wall_seconds: float) -> dict[str, float]:
    """Wall-clock rates of one run (`work` is what it tokenized itself, reused inputs excluded), and
    the tokens one tokenizing worker encodes per second of its CPU time, named as such."""
    wall = max(wall_seconds, 1e-9)
    return {"docs_per_second": work.documents / wall, "tokens_per_second": work.tokens / wall,
            "mb_per_second": work.bytes / wall / 1e6,
            "tokens_per_worker_cpu_second": work.tokens / max(work.encode_cpu_seconds, 1e-9)}
