"""A tqdm progress bar over documents that also shows tokens/s and MB/s of text."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from data_pipeline.encoder import BatchResult
from data_pipeline.stats import Counts


class Progress:
    def __init__(self, enabled: bool) -> None:
        self.bar = tqdm(unit=" docs", unit_scale=True, dynamic_ncols=True, mininterval=1.0,
                        disable=not enabled, file=sys.stderr)
        self.started = time.monotonic()
        self.tokens = 0
        self.bytes = 0
        self.last_postfix = 0.0

    def add_batch(self, result: BatchResult) -> None:
        self.tokens += sum(len(t) for t in result.tokens.values())
        self.bytes += int(result.doc_bytes.sum())
        self._advance(result.documents)

    def add_finished(self, counts: Counts) -> None:
        """An input finished by an earlier run: counted, but not in the rates of this one."""
        self.bar.update(counts.documents)

    def warn(self, message: str) -> None:
        tqdm.write(f"warning: {message}", file=sys.stderr)

    def close(self) -> None:
        self._show_rates(time.monotonic())  # the last figure shown is the whole run's, not a stale one
        self.bar.close()

    def _advance(self, documents: int) -> None:
        self.bar.update(documents)
        now = time.monotonic()
        if now - self.last_postfix >= 1.0:
            self._show_rates(now)

    def _show_rates(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        self.bar.set_postfix_str(f"{self.tokens / elapsed:,.0f} tok/s, {self.bytes / elapsed / 1e6:.2f} MB/s",
                                 refresh=False)
        self.last_postfix = now
