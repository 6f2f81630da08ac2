"""The tokenizing worker processes: an ordered, bounded parallel map over raw batches.

The single reader submits batches as they are read and the single writer receives the results
in submission order, so the output never depends on which worker finished first.  Items that
are not batches (input boundaries, read failures) travel through in their place in the order.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from data_pipeline.encoder import EncodeSettings, encode_batch, encode_in_worker, init_worker
from data_pipeline.sources import RawBatch
from data_pipeline.tokenizer import Tokenizer

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor


class EncoderPool:
    """`workers` processes (0: tokenize in the calling process)."""

    def __init__(self, tokenizer: Tokenizer, eod_token: str | None, settings: EncodeSettings, workers: int) -> None:
        self.tokenizer, self.eod_token, self.settings, self.workers = tokenizer, eod_token, settings, workers
        self.executor: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Start the workers early, so that they load while the writer gets ready."""
        if self.workers and self.executor is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # forkserver: workers fork from a fresh server process, safe whatever the caller has
            # running (threads, CUDA, process groups); a worker that cannot start breaks the pool
            # with an error instead of being restarted forever
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["data_pipeline.encoder"])
            self.executor = ProcessPoolExecutor(self.workers, mp_context=context, initializer=init_worker,
                                                initargs=(self.tokenizer.path, self.eod_token, self.settings,
                                                          os.getpid()))

    def map(self, items: Iterable[object]) -> Iterator[object]:
        """Encoded results of the RawBatch items, other items as they are, all in input order."""
        if not self.workers:
            for item in items:
                yield encode_batch(self.tokenizer, self.settings, item) if isinstance(item, RawBatch) else item
            return
        self.start()
        assert self.executor is not None  # started: self.workers is not 0
        in_flight = 2 * self.workers + 2  # bounded: the reader never runs far ahead of the writer
        pending: deque = deque()
        try:
            for item in items:
                pending.append(self.executor.submit(encode_in_worker, item) if isinstance(item, RawBatch) else item)
                while len(pending) >= in_flight:
                    yield _result(pending.popleft())
            while pending:
                yield _result(pending.popleft())
        except BrokenProcessPool:
            raise RuntimeError("a tokenizer worker process died (its error is above); note that worker "
                               "processes cannot start when the main program is read from stdin: run it "
                               "from a file, or use workers=0") from None

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None


def _result(item: object) -> object:
    return item.result() if isinstance(item, Future) else item
