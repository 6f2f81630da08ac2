"""Word-problem generation throughput on one CPU core: sampling plus prefix-product scan.

    python tools/bench/bench_word_problem.py [--tokens 4194304] [--repeats 5] [--p 0.1]

One row per (algebra, length): the batch holds about `--tokens` tokens, and the rate is tokens per
second of the best of `--repeats` runs (inputs and labels included, as `generate` returns them).
The process is pinned to one core (the generator is single-threaded numpy) so the figure is per core.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from data_pipeline.synthetic.word_problem import WordProblemSpec, generate_words


def rate(group: str, length: int, tokens: int, p: float, repeats: int) -> tuple[int, float]:
    """(batch size, best tokens per second) for words of `length` over `group`."""
    spec = WordProblemSpec(group, length, p, seed=0)
    batch = max(1, tokens // length)
    generate_words(spec, min(batch, 64), np.random.default_rng(0))  # warm-up: table, caches
    best = float("inf")
    for repeat in range(repeats):
        rng = np.random.default_rng(repeat)
        start = time.perf_counter()
        generate_words(spec, batch, rng)
        best = min(best, time.perf_counter() - start)
    return batch, batch * length / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1 << 22, help="tokens per timed batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--p", type=float, default=0.1, help="hard-token probability")
    parser.add_argument("--groups", default="S5,A5,Ma_A5")
    parser.add_argument("--lengths", default="64,256,1024")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    print(f"{'algebra':<8} {'length':>6} {'batch':>7} {'Mtokens/s':>10}")
    for group in args.groups.split(","):
        for length in (int(x) for x in args.lengths.split(",")):
            batch, tokens_per_s = rate(group, length, args.tokens, args.p, args.repeats)
            print(f"{group:<8} {length:>6} {batch:>7} {tokens_per_s / 1e6:>10.1f}")


if __name__ == "__main__":
    main()
