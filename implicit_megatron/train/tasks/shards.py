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


def data_summary(cfg: Config) -> tuple[str, str | None]:
    """(one line: tokens per split, planned tokens and the epochs they make; a warning or None).
    The plan reads steps x global batch samples of seq_len + 1 tokens (seq_len new tokens each)."""
    from data_pipeline.packed import epochs_planned, split_tokens

    samples = cfg.train.steps * cfg.train.global_batch_size
    epochs, train = epochs_planned(cfg.data.prefixes, cfg.data.weights, cfg.data.seq_len, samples)
    valid, test = (split_tokens(cfg.data.prefixes, split) for split in ("valid", "test"))
    planned = samples * cfg.data.seq_len
    line = (f"[data] train {train:,} tokens, valid {valid:,}, test {test:,}; the plan reads {planned:,} "
            f"({cfg.train.steps:,} steps x {cfg.train.global_batch_size} x {cfg.data.seq_len}): "
            f"{epochs:.2f} epochs of the train split")
    if epochs <= 1:
        return line, None
    return line, (f"train.steps={cfg.train.steps} reads the training data {epochs:.1f} times (train {train:,} "
                  f"tokens, the plan {planned:,}): later epochs repeat the same samples; add data or lower "
                  f"train.steps")


def train_batches(cfg: Config, dp_rank: int, dp_size: int, grad_accum: int) -> DistributedBatchIterator:
    dataset = build_packed_dataset(cfg.data.prefixes, cfg.data.weights, "train", seq_len=cfg.data.seq_len,
                                   seed=cfg.data.seed, num_samples=cfg.train.steps * cfg.train.global_batch_size,
                                   cache_dir=cfg.data.index_cache)
    return DistributedBatchIterator(dataset, cfg.train.micro_batch_size, dp_rank, dp_size, grad_accum,
                                    vocab_size=cfg.model.vocab_size, source=f"data.prefixes {cfg.data.prefixes}")


def valid_dataset(cfg: Config):
    """One epoch of the validation split; every evaluation reads its first train.eval_samples windows."""
    return build_packed_dataset(cfg.data.prefixes, cfg.data.weights, "valid", seq_len=cfg.data.seq_len,
                                seed=cfg.data.seed, num_samples=None, cache_dir=cfg.data.index_cache)
