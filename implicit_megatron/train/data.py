"""The training and validation data of a run, from the config's shard prefixes."""

from __future__ import annotations

from data_pipeline.packed import DistributedBatchIterator, build_packed_dataset
from implicit_megatron.config import Config
from implicit_megatron.errors import RunRefused

QUICKSTART_SPLIT = 0.05  # valid and test fractions when a small bundled corpus is tokenized on first use


def prepare_shards(cfg: Config) -> None:
    """Tokenize `data.source` into the first prefix when its shards are missing (the quickstart);
    only into a prefix under data/cache/ (data_pipeline.build.builds_from_source)."""
    from data_pipeline.build import builds_from_source, ensure_shards

    if cfg.data.source is None or not cfg.data.prefixes or not builds_from_source(cfg.data.prefixes[0]):
        return

    from data_pipeline.build import SourceMismatch
    from data_pipeline.plan import PreprocessError

    try:
        ensure_shards(cfg.data.source, cfg.data.prefixes[0], cfg.data.tokenizer, QUICKSTART_SPLIT, QUICKSTART_SPLIT)
    except PreprocessError as err:  # an empty source, say
        raise RunRefused(f"data.source {cfg.data.source}: {err}") from None
    except SourceMismatch as err:
        raise RunRefused(f"data.source: {err}") from None


def train_batches(cfg: Config, dp_rank: int, dp_size: int, grad_accum: int) -> DistributedBatchIterator:
    dataset = build_packed_dataset(cfg.data.prefixes, cfg.data.weights, "train", seq_len=cfg.data.seq_len,
                                   seed=cfg.data.seed, num_samples=cfg.train.steps * cfg.train.global_batch_size,
                                   cache_dir=cfg.data.index_cache)
    return DistributedBatchIterator(dataset, cfg.train.micro_batch_size, dp_rank, dp_size, grad_accum)


def valid_dataset(cfg: Config):
    """One epoch of the validation split; every evaluation reads its first train.eval_samples windows."""
    return build_packed_dataset(cfg.data.prefixes, cfg.data.weights, "valid", seq_len=cfg.data.seq_len,
                                seed=cfg.data.seed, num_samples=None, cache_dir=cfg.data.index_cache)
