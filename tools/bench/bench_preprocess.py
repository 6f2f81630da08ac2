"""Preprocessing throughput per worker against the tokenizer's own ceiling.

    python tools/bench/bench_preprocess.py [--repeat 4] [--workers 1 2] [--trials 3]

Ceiling: one thread running the tokenizer's `encode_batch` over the bundled corpus, in the same
batches the pipeline forms, in a process started like a worker: what a worker could do if
reading, decoding, hashing, packing and writing were free.  Pipeline: complete `preprocess` runs
(jsonl.zst in, shards and stats out) over the corpus copied into R and 2R input files, with N
worker processes.

Three views of a worker's rate, because a shared machine's load distorts wall-clock figures:
- end-to-end: tokens(2R) / time(2R) / N, start-up (worker processes, tokenizer loading) included;
- steady: the marginal rate (tokens(2R) - tokens(R)) / (time(2R) - time(R)) / N;
- per CPU-second: tokens per CPU-second of the worker processes (everything they do, task
  transfer included) against tokens per CPU-second of the ceiling loop: the pipeline's own cost,
  whatever else runs on the machine.
Each trial measures the ceiling right before its pipeline runs, ratios are taken within a trial
and the table shows medians over `--trials`, so that load from other processes distorts little.
The writer's cost is measured as tokens per CPU-second of the main process.

The projection for a 207 B-token corpus on a 64-core node assumes 63 workers, each on a core of
its own at the measured tokens per CPU-second (one core left to the writer), and checks that the
single writer keeps up.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "data" / "corpus" / "shakespeare.jsonl.zst"
TOKENIZER = REPO / "data" / "tokenizers" / "gpt-neox-20b.json.xz"
TARGET_TOKENS = 207e9
NODE_WORKERS = 63


def corpus_batches() -> list[list[str]]:
    """The corpus's documents, batched exactly as the pipeline batches them."""
    from data_pipeline.encoder import decode_record
    from data_pipeline.sources import InputSpec, read_batches

    return [[text for line in batch.records() if (text := decode_record(line, True, "text")[0])]
            for batch in read_batches(InputSpec(str(CORPUS), "jsonl"), "text")]


def measure_ceiling(repeat: int) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second) of single-threaded `encode_batch`, measured
    in a fresh process started like the workers (a process with torch loaded runs it slower)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["data_pipeline.encoder"])
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(_ceiling_in_process, repeat).result()


def _ceiling_in_process(repeat: int) -> tuple[float, float]:
    from data_pipeline.tokenizer import load_tokenizer

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    batches = corpus_batches()
    tokenizer = load_tokenizer(TOKENIZER)
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = sum(sum(map(len, tokenizer.encode_batch(texts))) for _ in range(repeat) for texts in batches)
    return tokens / (time.perf_counter() - wall), tokens / (time.process_time() - cpu)


def run_pipeline(workers: int, copies: int, scratch: Path) -> dict:
    """Tokens, wall seconds, writer CPU seconds and worker CPU seconds of one complete run."""
    from data_pipeline.pipeline import PreprocessConfig, run_preprocess

    run_dir = Path(tempfile.mkdtemp(dir=scratch))
    inputs = []
    for k in range(copies):
        inputs.append(str(run_dir / f"copy-{k:03d}.jsonl.zst"))
        shutil.copyfile(CORPUS, inputs[-1])
    config = PreprocessConfig(inputs=inputs, tokenizer=str(TOKENIZER), output_prefix=str(run_dir / "out" / "neox"),
                              workers=workers, append_eod=True, valid_fraction=0.05, test_fraction=0.001,
                              progress=False)
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    stats = run_preprocess(config)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    shutil.rmtree(run_dir)
    writer_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"tokens": stats["tokens"], "wall": wall, "writer_cpu": writer_cpu,
            "worker_cpu": stats["encode_cpu_seconds"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=4, help="R: corpus copies in the smaller run")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the ceiling is one thread, as in each worker
    sys.path.insert(0, str(REPO))
    from data_pipeline.indexed import megatron_indexed

    megatron_indexed()  # import the writer's library before timing anything
    trials: dict[int, list[dict]] = {w: [] for w in args.workers}
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(args.trials):
            for workers in args.workers:  # each pipeline pair right after its own ceiling: same conditions
                trials[workers].append(measure_trial(workers, args.repeat, Path(scratch)))
    print_table(trials)
    return 0


def measure_trial(workers: int, repeat: int, scratch: Path) -> dict:
    ceiling_wall, ceiling_cpu = measure_ceiling(repeat)
    small = run_pipeline(workers, repeat, scratch)
    large = run_pipeline(workers, 2 * repeat, scratch)
    end_to_end = large["tokens"] / large["wall"] / workers
    steady = (large["tokens"] - small["tokens"]) / (large["wall"] - small["wall"]) / workers
    per_cpu = large["tokens"] / large["worker_cpu"]
    return {"ceiling": ceiling_wall, "end_to_end": end_to_end, "end_to_end_x": end_to_end / ceiling_wall,
            "steady": steady, "steady_x": steady / ceiling_wall, "per_cpu": per_cpu, "per_cpu_x": per_cpu / ceiling_cpu,
            "writer": (large["tokens"] - small["tokens"]) / max(large["writer_cpu"] - small["writer_cpu"], 1e-9)}


def print_table(trials: dict[int, list[dict]]) -> None:
    """Medians over the trials (ratios are taken within a trial, then the median)."""
    print(f"tokens per second per worker, medians of {len(next(iter(trials.values())))} interleaved trials; "
          "x = against the ceiling measured just before, in the same trial\n")
    header = (f"{'workers':>7} | {'ceiling':>9} | {'end-to-end':>10} | {'x':>4} | {'steady':>9} | {'x':>4} | "
              f"{'per CPU-s':>9} | {'x':>4} | {'writer tok/CPU-s':>16}")
    print(header)
    print("-" * len(header))
    medians = {}
    for workers, results in trials.items():
        m = medians[workers] = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(f"{workers:>7} | {m['ceiling']:>9,.0f} | {m['end_to_end']:>10,.0f} | {m['end_to_end_x']:>4.2f} | "
              f"{m['steady']:>9,.0f} | {m['steady_x']:>4.2f} | {m['per_cpu']:>9,.0f} | {m['per_cpu_x']:>4.2f} | "
              f"{m['writer']:>16,.0f}")
    print("\nend-to-end: the 2R run's tokens / wall time / workers (start-up included); steady: the marginal "
          "rate between the R and 2R runs; per CPU-s: tokens per CPU-second of the workers (no contention)")
    # on a dedicated node every worker has a core of its own: its rate is its rate per CPU-second
    per_worker = min(m["per_cpu"] for m in medians.values())
    workers_rate = per_worker * NODE_WORKERS
    writer_rate = min(m["writer"] for m in medians.values())
    node_rate = min(workers_rate, writer_rate)
    bound = "the workers" if workers_rate <= writer_rate else "the single writer"
    print(f"\nprojection, {TARGET_TOKENS / 1e9:.0f} B tokens on a 64-core node: {NODE_WORKERS} workers x "
          f"{per_worker:,.0f} tokens/s = {workers_rate / 1e6:,.1f} M tokens/s; writer capacity "
          f"{writer_rate / 1e6:,.1f} M tokens/s -> {TARGET_TOKENS / node_rate / 3600:.1f} h, bound by {bound} "
          f"(if the writer kept up: {TARGET_TOKENS / workers_rate / 3600:.1f} h)")


if __name__ == "__main__":
    sys.exit(main())
