"""Tokenize inputs into megatron-core IndexedDataset shards, resumably.

Layout while a run is in progress (all under the output prefix):

    {prefix}.lock                       held while a run works on this prefix
    {prefix}.work/{i:05d}-{key}/        finished input i: train/valid/test .bin/.idx + done.json
    {prefix}.work/tmp-.../              the input being written (renamed when complete)

Each input is processed into its own partial files, which are renamed into place with a done
marker only when complete; a rerun with the same arguments reuses finished inputs (see
`parts`).  At the end the partial files are merged in input order into
`{prefix}_{split}[_{k:05d}]`, `{prefix}_stats.json` is written last (it marks the output
complete) and the work folder is removed.  Every step is deterministic, so an interrupted and
resumed run gives the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import shutil
import sys
import time

from data_pipeline.indexed import document_lengths
from data_pipeline.locking import exclusive_lock
from data_pipeline.merge import merge_split
from data_pipeline.parts import reuse_finished, write_json_atomic, write_parts
from data_pipeline.plan import Plan, PreprocessConfig, PreprocessError, plan_run
from data_pipeline.progress import Progress
from data_pipeline.shard_check import ShardError, read_stats
from data_pipeline.sources import dataset_dict_splits, first_record_fields
from data_pipeline.splits import SPLITS
from data_pipeline.stats import Counts, throughput
from data_pipeline.workers import EncoderPool

__all__ = ["PreprocessConfig", "PreprocessError", "run_preprocess"]


def run_preprocess(config: PreprocessConfig) -> dict:
    """Build (or finish building) the shards of `config`; returns the stats also written to disk."""
    if "__mp_main__" in sys.modules and sys.modules["__mp_main__"] is not sys.modules.get("__main__"):
        # a starting worker process is re-running the caller's script: stop it rather than deadlock
        raise RuntimeError("preprocessing was started again by a worker process re-running the main "
                           "script; put the script's entry point under `if __name__ == '__main__':`")
    plan = plan_run(config)
    for spec in plan.specs:
        splits = dataset_dict_splits(spec.location) if spec.kind == "disk" else None
        if splits:
            used = ", ".join(f"{theirs} -> {ours}" for theirs, ours in splits.items())
            _say(f"{spec.location}: a DatasetDict; its splits are used as they are ({used}); --valid-fraction and "
                 f"--test-fraction do not apply to it")
    with exclusive_lock(f"{plan.prefix}.lock"):
        finished = _finished_stats(plan)
        if finished is not None:
            if plan.work_dir.is_dir():  # a run killed between its stats and this removal
                shutil.rmtree(plan.work_dir)
            _say(f"{plan.stats_path} is already complete; nothing to do")
            return finished
        return _run_locked(plan)


def _run_locked(plan: Plan) -> dict:
    started = time.monotonic()
    plan.work_dir.mkdir(exist_ok=True)
    for leftover in plan.work_dir.glob("tmp-*"):  # the input an interrupted run was writing
        shutil.rmtree(leftover)
    total = Counts()
    parts = reuse_finished(plan, total)
    reused, before = len(parts), Counts.from_dict(total.to_dict())
    if reused:
        _say(f"resuming {plan.prefix}: {reused} of {len(plan.specs)} inputs were finished by an earlier "
             f"run ({total.documents} documents) and are reused")
    encoders = EncoderPool(plan.tokenizer, plan.config.eod_token, plan.settings, plan.config.workers)
    progress = Progress(plan.config.progress)
    progress.add_finished(total)
    try:
        if reused < len(plan.specs) and plan.config.limit_docs != total.documents:
            encoders.start()  # the workers load while the writer imports megatron-core
            parts += write_parts(plan, reused, total, encoders, progress)
    finally:
        encoders.close()
        progress.close()
    if not total.documents and not total.skipped.get("unreadable_file"):
        shutil.rmtree(plan.work_dir)
        raise PreprocessError(_no_documents(plan, total))
    merged = {split: merge_split([str(p / split) for p in parts], plan.prefix, split, plan.dtype,
                                 plan.config.max_shard_tokens) for split in SPLITS}
    shards = {split: merged[split].shards for split in SPLITS}
    stats = _stats(plan, total, total.minus(before), shards, len(parts), reused, time.monotonic() - started)
    stats["files"] = {name: record for split in SPLITS for name, record in merged[split].files.items()}
    # An input that could not be read to its end leaves the build incomplete: a rerun (after the input
    # is repaired) rebuilds from the parts before it instead of calling the shards finished.
    stats["incomplete"] = bool(total.skipped.get("unreadable_file"))
    write_json_atomic(plan.stats_path, stats)
    if not stats["incomplete"]:
        shutil.rmtree(plan.work_dir)
    _say(_summary(stats))
    for warning in short_splits(stats):
        _say(f"warning: {warning}")
    if plan.config.max_shard_tokens is not None:
        over = over_the_cap(shards, plan.config.max_shard_tokens)
        if over:
            _say(f"note: {len(over)} document(s) longer than --max-shard-tokens {plan.config.max_shard_tokens} "
                 f"(the longest {max(over.values()):,} tokens) got a shard of their own, over the cap: documents "
                 f"are never cut ({', '.join(sorted(over)[:3])}{', ...' if len(over) > 3 else ''})")
    return stats


def over_the_cap(shards: dict[str, list[str]], cap: int) -> dict[str, int]:
    """{shard: tokens} of the shards over `cap`: each holds one document longer than it."""
    sizes = {shard: int(document_lengths(shard).sum()) for names in shards.values() for shard in names}
    return {shard: tokens for shard, tokens in sizes.items() if tokens > cap}


SAMPLE_LENGTHS = (2048, 1024)  # the paper's training length, and a common shorter one


def short_splits(stats: dict) -> list[str]:
    """Splits made (a fraction above 0) that hold fewer tokens than one sample of a common length:
    a run at that length skips validation on them, and evaluation cannot read them."""
    warnings = []
    for split in ("valid", "test"):
        tokens = stats["splits"][split]["tokens"]
        if stats.get(f"{split}_fraction", 0) > 0 and tokens < SAMPLE_LENGTHS[0] + 1:
            fits = [length for length in SAMPLE_LENGTHS if tokens >= length + 1]
            which = (f"enough for data.seq_len {fits[0]} but not {SAMPLE_LENGTHS[0]}" if fits
                     else f"fewer than one sample of {SAMPLE_LENGTHS[-1] + 1}")
            warnings.append(f"the {split} split holds {tokens} tokens, {which} (data.seq_len + 1 tokens): a "
                            f"run skips validation on it and evaluation refuses it; raise --{split}-fraction")
    return warnings


def _no_documents(plan: Plan, total: Counts) -> str:
    """Why no document came out of the inputs, with the likeliest cause."""
    key = plan.config.text_key
    missing = total.skipped.get("missing_text", 0)
    if missing and missing == sum(total.skipped.values()):
        fields = first_record_fields(plan.specs[0])
        seen = f"; the first record of {plan.specs[0].location} has {', '.join(map(repr, fields))}" if fields else ""
        return (f"--text-key: none of the {missing} records has a {key!r} field{seen}: name the text field with "
                "--text-key")
    if total.skipped:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(total.skipped.items()))
        return f"--input: every record was skipped ({reasons}); no shard was written"
    return f"--input: no record in {', '.join(s.location for s in plan.specs)} (empty?); no shard was written"


def _finished_stats(plan: Plan) -> dict | None:
    """The stats of a completed earlier run with the same fingerprint; an error for other settings."""
    if not plan.stats_path.is_file():
        return None
    try:
        stats = read_stats(plan.prefix) or {}
    except ShardError:
        stats = {}
    if stats.get("incomplete"):  # an input was unreadable: build again
        return None
    if stats.get("fingerprint") not in (plan.fingerprint, plan.earlier_fingerprint):  # built before version 2 too
        raise PreprocessError(
            f"--output-prefix: {plan.stats_path} records shards built from other inputs or settings; "
            f"remove {plan.prefix}_* to rebuild, or choose another --output-prefix")
    return stats


def _stats(plan: Plan, total: Counts, work: Counts, shards: dict[str, list[str]], processed: int,
           reused: int, wall: float) -> dict:
    """`total` counts the whole job; `work` what this run tokenized itself (the rates are its)."""
    data = total.to_dict()
    split_docs, split_tokens = data.pop("split_documents"), data.pop("split_tokens")
    config = plan.config
    return {
        **data, **throughput(work, wall), "wall_seconds": wall,
        "splits": {split: {"documents": split_docs[split], "tokens": split_tokens[split],
                           "shards": shards[split]} for split in SPLITS},
        "inputs": [spec.location for spec in plan.specs], "inputs_processed": processed,
        "inputs_reused": reused,  # finished by an earlier, interrupted run
        **plan.tokenizer_record,  # the tokenizer's file (absolute), sha256 and identity
        "vocab_size": plan.tokenizer.vocab_size, "eod_id": plan.tokenizer.eod_id, "eod_token": config.eod_token,
        "append_eod": config.append_eod, "dtype": plan.settings.dtype, "text_key": config.text_key,
        "valid_fraction": config.valid_fraction, "test_fraction": config.test_fraction,
        "max_shard_tokens": config.max_shard_tokens, "limit_docs": config.limit_docs,
        "fingerprint": plan.fingerprint,
    }


def _summary(stats: dict) -> str:
    skipped = ", ".join(f"{k}={v}" for k, v in sorted(stats["skipped"].items())) or "none"
    reused = f", {stats['inputs_reused']} inputs reused" if stats["inputs_reused"] else ""
    return (f"{stats['documents']} documents, {stats['tokens']} tokens in {stats['wall_seconds']:.1f} s "
            f"({stats['tokens_per_second']:,.0f} tokens/s{reused}; one worker encodes "
            f"{stats['tokens_per_worker_cpu_second']:,.0f} tokens/s); skipped: {skipped}")


def _say(message: str) -> None:
    """A line for the user (on stderr); --quiet drops the progress bar only, not these."""
    print(message, file=sys.stderr)
