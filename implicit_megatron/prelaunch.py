"""The check before a launch: a config's own rules, and what needs the world around it.

    implicit_megatron.load_config(path, overrides, world_size, check_files=True, check_data=False)
    checked_configs(path, overrides, world_size)   each launch's config (a curriculum's: one per phase)

`python -m implicit_megatron.config`, the launch (implicit_megatron/launch/) and every rank load configs
here. `implicit_megatron.config.read_config` checks a config on its own (types, ranges, batch
sizes, the curriculum); this module adds what needs files, data or a task: the tokenizer
(`check_files`), every data shard and its tokenizer (`check_data`), the word problem's algebra,
catbAbI's folder and vocabulary, GPUs for NCCL. It sits above `config`, `data_pipeline` and the
training tasks, which `config` never imports. Errors name the file and key at fault, as
`read_config`'s do.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from implicit_megatron.config import Config, blame, read_config
from implicit_megatron.config.plan import own_launches
from implicit_megatron.config.reading import read_curriculum
from implicit_megatron.utils.typed_yaml import ConfigError


def load_config(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (),
                world_size: int | None = None, check_files: bool = True, check_data: bool = False) -> Config:
    """Read CONFIG (and its `base:` chain), apply overrides, check its own rules and, with
    `check_files`, the files it names; `check_data` (the pre-launch check, and each rank) also
    checks every data shard."""
    cfg = read_config(path, overrides, world_size)
    check(cfg, check_files, check_data)
    return cfg


def check(cfg: Config, check_files: bool = True, check_data: bool = False) -> None:
    """The checks of a loaded config that need more than the config; raise ConfigError."""
    fail = blame(cfg)
    if cfg.task.kind == "word_problem":
        validate_word_problem(cfg, fail)
    elif cfg.task.kind == "catbabi":
        validate_catbabi(cfg, fail, check_files, check_data)
    elif not cfg.data.prefixes and check_files:  # without file checks: a model's config (an import, a tool)
        fail("data.prefixes", "name at least one shard prefix (the output prefix of data_pipeline.preprocess)")
    if cfg.distributed.backend == "nccl" and check_files:
        import torch

        if not torch.cuda.is_available():
            fail("distributed.backend", "nccl needs GPUs, and none is visible; use auto or gloo")
    if check_files:
        validate_output(cfg, fail)
    if check_files and cfg.tracking.wandb.project is not None:
        from implicit_megatron.utils.extras import missing

        problem = missing("wandb", "tracking.wandb.project (Weights & Biases)")
        if problem is not None:
            fail("tracking.wandb.project", problem)
    if check_files and cfg.task.kind == "language_model":
        validate_tokenizer(cfg, fail)
    if check_data and cfg.task.kind == "language_model":
        validate_data(cfg, fail)


def notes(cfg: Config) -> list[str]:
    """What a user should know before the launch that is not an error (the pre-launch check prints
    them): a plan that reads the training data more than once; a valid split too short to validate;
    an index cache beside the shards, which is not read."""
    if cfg.task.kind != "language_model" or not cfg.data.prefixes:
        return []
    found = [note for note in (epochs_warning(cfg), validation_note(cfg)) if note is not None]
    from data_pipeline.index_cache import index_cache_dir, received_caches

    where = index_cache_dir(cfg.data.prefixes, cfg.data.index_cache)
    for beside in received_caches(cfg.data.prefixes, where):
        found.append(f"{beside} is not read (an index cache beside the shards may have come with them and could "
                     f"hold anything): their packed-sample indices are built in {where} (data.index_cache names "
                     "another place)")
    return found


def epochs_warning(cfg: Config) -> str | None:
    """The data summary's warning where the shards are there to count (not before a first build)."""
    from data_pipeline.shard_check import ShardError
    from implicit_megatron.train.tasks.shards import data_summary

    try:
        return data_summary(cfg)[1]
    except (FileNotFoundError, ShardError, ValueError):  # not built yet, or refused by the data check
        return None


def validation_note(cfg: Config) -> str | None:
    """Where the shards are there to count and their valid split cannot give one sample (none made,
    or too short): validation is skipped, as the trainer says in one warning."""
    from data_pipeline.packed import split_tokens
    from data_pipeline.shard_check import ShardError

    try:
        if split_tokens(cfg.data.prefixes, "train") == 0:  # not built yet
            return None
        tokens = split_tokens(cfg.data.prefixes, "valid")
    except ShardError:  # refused by the data check
        return None
    if tokens >= cfg.data.seq_len + 1:
        return None
    return (f"the valid split of data.prefixes holds {tokens} tokens, fewer than one sample (data.seq_len + 1 = "
            f"{cfg.data.seq_len + 1}): validation is skipped; rebuild the shards with a larger --valid-fraction "
            "to validate")


def validate_output(cfg: Config, fail) -> None:
    """The run folder can be made and written (not a file, not on a read-only file system), and is
    the run's own (not a link, not inside another run's folder)."""
    from implicit_megatron.utils.output_paths import output_problem, run_folder_problem

    problem = output_problem(cfg.output_dir, folder=True) or run_folder_problem(cfg.output_dir)
    if problem:
        fail("train.output_dir", f"the run folder {cfg.output_dir}: {problem}")


def validate_word_problem(cfg: Config, fail) -> None:
    from data_pipeline.synthetic.algebra import get_algebra

    w = cfg.task.word_problem  # p, eval_p, eval_words and eval_lengths: their domains (config.schema)
    try:
        size = get_algebra(w.algebra).size
    except ValueError as err:
        fail("task.word_problem.algebra", str(err))
    if cfg.model.vocab_size != size:
        fail("model.vocab_size", f"the {w.algebra} word problem has {size} elements (inputs and labels); "
                                 f"set model.vocab_size={size}")
    if cfg.model.separate_documents:
        fail("model.separate_documents", "word problems have no documents to separate")


def taken_from(path: str | Path) -> str:
    """Where a relative path of a config was looked for: paths in a config are taken from the working
    directory, as Megatron's and GPT-NeoX's are (launch/pretrain.sh runs from the repository root);
    `base:` paths from the file that names them."""
    if Path(path).is_absolute():
        return ""
    return f" (a relative path: looked for from the working directory {os.getcwd()})"


def validate_tokenizer(cfg: Config, fail) -> None:
    path = Path(cfg.data.tokenizer)
    if not path.exists():
        fail("data.tokenizer", f"tokenizer not found: {path}{taken_from(path)}")
    try:
        vocab = tokenizer_vocab_size(path)
    except (OSError, ValueError) as err:
        fail("data.tokenizer", f"cannot load tokenizer {path}: {err}")
    if cfg.model.vocab_size < vocab:
        fail("model.vocab_size", f"{cfg.model.vocab_size} is smaller than the vocabulary of "
                                 f"{path} ({vocab} tokens)")


def tokenizer_vocab_size(path: Path) -> int:
    """The vocabulary of the tokenizer file at `path`, read once per process while the file is the
    same one (a curriculum checks each phase's config against the same tokenizer)."""
    info = path.stat()
    return _vocab_size(str(path.resolve()), (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _vocab_size(path: str, file: tuple[int, int, int, int]) -> int:  # a load that raises is not kept
    from data_pipeline.tokenizer import load_tokenizer

    return load_tokenizer(Path(path)).vocab_size


def validate_data(cfg: Config, fail) -> None:
    """Every prefix has whole shards (data_pipeline.shard_check) for training, and enough tokens for
    one sample; a missing prefix is an error unless data.source builds it."""
    from data_pipeline.build import builds_from_source, source_mismatch
    from data_pipeline.indexed import find_shards
    from data_pipeline.shard_check import ShardError, check_build, check_shard
    from implicit_megatron.utils.output_paths import first_unwritable

    for i, prefix in enumerate(cfg.data.prefixes):
        key = f"data.prefixes[{i}]"
        try:
            check_build(prefix, cfg.data.verify_shards)
        except ShardError as err:
            fail(key, str(err))
        for split in ("train", "valid"):
            try:
                shards = find_shards(prefix, split)
            except FileNotFoundError:
                if i == 0 and cfg.data.source is not None and builds_from_source(prefix):
                    unwritable = first_unwritable(Path(prefix).parent)
                    if unwritable is not None:  # e.g. a container's user that does not own a mounted data/cache
                        fail(key, f"{prefix!r} is to be tokenized from data.source, but {unwritable} is not writable "
                                  f"by this user (uid {os.getuid()}): change its owner, or build the image with "
                                  f"USER_UID of its owner")
                    break  # the quickstart: tokenized from data.source on first use
                if split == "valid":
                    continue  # validation is then skipped, with a warning (train.tasks.language_model)
                fail(key, f"no shards for {prefix!r}{taken_from(prefix)}: neither {prefix}_train.bin/.idx nor "
                          f"{prefix}_train_00000.bin/.idx exists. Check the path, or build them: python -m "
                          f"data_pipeline.preprocess --input CORPUS --tokenizer {cfg.data.tokenizer} --output-prefix "
                          f"{prefix} --append-eod")
            tokens = 0
            try:
                for shard in shards:
                    tokens += check_shard(shard).tokens
            except ShardError as err:
                fail(key, str(err))
            if (i == 0 and split == "train" and cfg.data.source is not None and builds_from_source(prefix)
                    and os.path.isfile(cfg.data.source)):
                problem = source_mismatch(cfg.data.source, prefix)
                if problem is not None:
                    fail("data.source", problem)
            if split == "train" and tokens < cfg.data.seq_len + 1:
                fail(key, f"the train split of {prefix!r} holds {tokens} tokens, fewer than one sample "
                          f"(data.seq_len + 1 = {cfg.data.seq_len + 1})")
        if not cfg.data.allow_tokenizer_mismatch:
            check_shard_tokenizer(cfg, prefix, fail)
    check_cache_folder(cfg, fail)


def check_cache_folder(cfg: Config, fail) -> None:
    """The packed-sample index cache, where there is one, is this user's and holds plain arrays only
    (data_pipeline.index_cache), checked before any process starts."""
    from data_pipeline.index_cache import check_index_cache, index_cache_dir
    from data_pipeline.shard_check import ShardReadError

    cache = index_cache_dir(cfg.data.prefixes, cfg.data.index_cache)
    if os.path.lexists(cache):
        try:
            check_index_cache(cache)
        except ShardReadError as err:
            fail("data.index_cache", str(err))


def check_shard_tokenizer(cfg: Config, prefix: str, fail) -> None:
    """The shards' _stats.json names the tokenizer they were built with: the config's must be the
    same (data_pipeline.shard_tokenizer)."""
    from data_pipeline.shard_tokenizer import other_tokenizer

    problem = other_tokenizer(prefix, cfg.data.tokenizer)
    if problem:
        fail("data.tokenizer", f"{problem}. Point data.tokenizer at that tokenizer, rebuild the shards with this "
                               "one, or set data.allow_tokenizer_mismatch=true to train anyway", "data.prefixes")


def validate_catbabi(cfg: Config, fail, check_files: bool, check_data: bool) -> None:
    """The folder holds the train and evaluation splits (with check_files), and the model's vocabulary
    holds every word of them and the stream fills one window (with check_data: reads the stories)."""
    from data_pipeline.synthetic.catbabi import split_files

    c = cfg.task.catbabi
    if cfg.model.separate_documents:
        fail("model.separate_documents", "catbAbI is one stream; the model learns where stories end from <eos>")
    if not check_files:
        return
    if not Path(c.folder).is_dir():
        fail("task.catbabi.folder", f"no folder {c.folder}{taken_from(c.folder)}: put the bAbI v1.2 task files there "
                                    "(docs/paper.md: catbAbI)")
    for split in ("train", c.eval_split):
        try:
            split_files(c.folder, split)
        except FileNotFoundError as err:
            fail("task.catbabi.folder" if split == "train" else "task.catbabi.eval_split", str(err))
    if not check_data:
        return
    from data_pipeline.synthetic.catbabi import folder_vocabulary, split_windows

    words = len(folder_vocabulary(c.folder, c.split_answers))
    if cfg.model.vocab_size < words:
        fail("model.vocab_size", f"{cfg.model.vocab_size} is smaller than the catbAbI vocabulary of {c.folder} "
                                 f"({words} words); set model.vocab_size >= {words}")
    for split in ("train", c.eval_split):
        try:
            split_windows(c.folder, split, c.split_answers, cfg.data.seq_len, None)
        except ValueError as err:
            fail("data.seq_len", str(err))


def phase_configs(config: str, overrides: list[str], world_size: int | None = None,
                  check_files: bool = False, check_data: bool = False) -> list[Config]:
    """Every phase's config as its own launch will load it; a phase that names its processes is
    checked for its own data-parallel size, the others for `world_size`."""
    phases = read_curriculum(config, overrides).phases
    if not phases:
        raise ConfigError(config, "curriculum.phases", "no phases; run this config with launch/pretrain.sh")
    configs = []
    for phase in phases:
        size = world_size
        if phase.launch.processes_per_node is not None:
            size = (phase.launch.num_nodes or 1) * phase.launch.processes_per_node
        configs.append(load_config(config, [*overrides, f"curriculum.run_phase={phase.name}"], world_size=size,
                                   check_files=check_files, check_data=check_data))
    return configs


def checked_configs(config: str, overrides: list[str], world_size: int | None = None,
                    check: bool = True) -> list[Config]:
    """CONFIG as each launch will load it (a curriculum whose phases run as launches of their own:
    one per phase), its files and data checked with `check`; what a user should know is printed as
    notes. Raises ConfigError."""
    curriculum = read_curriculum(config, overrides)
    if curriculum.run_phase is None and own_launches(curriculum.phases):
        configs = phase_configs(config, overrides, world_size=world_size, check_files=check, check_data=check)
    else:
        configs = [load_config(config, overrides, world_size=world_size, check_files=check, check_data=check)]
    for note in dict.fromkeys(n for cfg in configs for n in notes(cfg)):
        print(f"note: {note}", file=sys.stderr)
    return configs
