"""Cross-field checks of a config's task, curriculum and tokenizer (called by config.validate).

Each takes the config and validate's `fail(key, message)`, which raises a ConfigError naming the
file and key at fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from implicit_megatron.config import Config


def validate_word_problem(cfg: Config, fail) -> None:
    from data_pipeline.synthetic.algebra import get_algebra

    w = cfg.task.word_problem
    for key in ("p", "eval_p"):
        value = getattr(w, key)
        if value is not None and not 0 <= value <= 1:
            fail(f"task.word_problem.{key}", f"expected a probability in [0, 1] or null, got {value}")
    if w.eval_words < 1 or any(length < 1 for length in w.eval_lengths):
        fail("task.word_problem.eval_words", "evaluation sets need at least one word of at least one element")
    try:
        size = get_algebra(w.algebra).size
    except ValueError as err:
        fail("task.word_problem.algebra", str(err))
    if cfg.model.vocab_size != size:
        fail("model.vocab_size", f"the {w.algebra} word problem has {size} elements (inputs and labels); "
                                 f"set model.vocab_size={size}")
    if cfg.model.separate_documents:
        fail("model.separate_documents", "word problems have no documents to separate")


PHASE_SOLVER_KEYS = ("max_iter", "tol", "phantom_steps")  # what every phase sets for itself


def validate_curriculum(cfg: Config, fail, sources: dict[str, str] | None = None) -> None:
    from implicit_megatron.config import phase_bounds
    from implicit_megatron.utils.typed_yaml import COMMAND_LINE

    phases = cfg.curriculum.phases
    names = [p.name for p in phases]
    for k in PHASE_SOLVER_KEYS if phases else ():
        if (sources or {}).get(f"implicit.{k}") == COMMAND_LINE:
            example = next((p.name for p in phases if p.kind == "free"), phases[-1].name) if k == "tol" \
                else phases[-1].name
            fail(f"implicit.{k}", f"every phase of the curriculum sets its own {k}, so this override would be "
                                  f"ignored; set it for a phase, e.g. curriculum.phases.{example}.{k}=... "
                                  f"(phases: {', '.join(names)})")
    for i, phase in enumerate(phases):
        key = f"curriculum.phases[{i}]"
        if names.count(phase.name) > 1:
            fail(f"{key}.name", f"phase name {phase.name!r} is used twice")
        if phase.kind != "free" and phase.tol is not None:
            fail(f"{key}.tol", f"a {phase.kind} phase runs exactly max_iter passes; remove tol {phase.tol} "
                               "or make the phase kind 'free'")
        if phase.kind == "free" and phase.tol is None:
            fail(f"{key}.tol", "a free phase needs a stopping tolerance (the paper: 0.05)")
        if phase.tol is not None and phase.tol <= 0:
            fail(f"{key}.tol", f"expected a positive tolerance, got {phase.tol}")
        if phase.max_iter < 1:
            fail(f"{key}.max_iter", f"expected at least 1, got {phase.max_iter}")
        if phase.kind == "unrolled" and phase.phantom_steps != 0:
            fail(f"{key}.phantom_steps", "an unrolled phase backpropagates through every pass: set phantom_steps 0")
        if phase.kind != "unrolled" and phase.phantom_steps < 1:
            fail(f"{key}.phantom_steps", f"expected at least 1, got {phase.phantom_steps}")
        if not 0 < phase.fraction <= 1:
            fail(f"{key}.fraction", f"expected a fraction in (0, 1], got {phase.fraction}")
        own = [k for k in ("zero_stage", "micro_batch_size") if getattr(phase, k) is not None]
        if own and cfg.curriculum.run_phase is None:
            fail(f"{key}.{own[0]}", "a phase with its own settings needs a launch of its own: run the curriculum "
                                    "with launch/curriculum.sh (or set curriculum.run_phase)")
        if phase.micro_batch_size is not None and phase.micro_batch_size < 1:
            fail(f"{key}.micro_batch_size", f"expected a positive value, got {phase.micro_batch_size}")
        for k in ("num_nodes", "processes_per_node"):
            if getattr(phase.launch, k) is not None and getattr(phase.launch, k) < 1:
                fail(f"{key}.launch.{k}", f"expected a positive value, got {getattr(phase.launch, k)}")
    if phases and not cfg.implicit.enabled:
        fail("curriculum.phases", "a curriculum needs implicit.enabled: true")
    if phases and abs(sum(p.fraction for p in phases) - 1) > 1e-6:
        fail("curriculum.phases", f"fractions must add up to 1, got {sum(p.fraction for p in phases):g}")
    for i, (phase, start, end) in enumerate(phase_bounds(cfg) if phases else []):
        if end <= start:
            fail(f"curriculum.phases[{i}].fraction", f"phase {phase.name!r} gets no step of train.steps "
                                                     f"{cfg.train.steps}")
    if cfg.curriculum.run_phase is not None and cfg.curriculum.run_phase not in names:
        fail("curriculum.run_phase", f"no phase named {cfg.curriculum.run_phase!r}; phases: {names}")


def validate_tokenizer(cfg: Config, fail) -> None:
    path = Path(cfg.data.tokenizer)
    if not path.exists():
        fail("data.tokenizer", f"tokenizer not found: {path}")
    from data_pipeline.tokenizer import load_tokenizer

    try:
        vocab = load_tokenizer(path).vocab_size
    except (OSError, ValueError) as err:
        fail("data.tokenizer", f"cannot load tokenizer {path}: {err}")
    if cfg.model.vocab_size < vocab:
        fail("model.vocab_size", f"{cfg.model.vocab_size} is smaller than the vocabulary of "
                                 f"{path} ({vocab} tokens)")


def builds_from_source(prefix: str) -> bool:
    """Shards are built from data.source only into a prefix under a data/cache/ folder (as the
    quickstart's): anywhere else a missing prefix is more likely a typo than a wish."""
    parts = Path(prefix).resolve().parts
    return any(parts[i:i + 2] == ("data", "cache") for i in range(len(parts) - 1))


def validate_data(cfg: Config, fail) -> None:
    """Every prefix has whole shards (data_pipeline.shard_check) for training, and enough tokens for
    one sample; a missing prefix is an error unless data.source builds it."""
    from data_pipeline.indexed import find_shards
    from data_pipeline.shard_check import ShardError, check_shard

    for i, prefix in enumerate(cfg.data.prefixes):
        key = f"data.prefixes[{i}]"
        for split in ("train", "valid"):
            try:
                shards = find_shards(prefix, split)
            except FileNotFoundError:
                if i == 0 and cfg.data.source is not None and builds_from_source(prefix):
                    break  # the quickstart: tokenized from data.source on first use
                if split == "valid":
                    continue  # validation then reports that it has no data
                fail(key, f"no shards for {prefix!r}: neither {prefix}_train.bin/.idx nor {prefix}_train_00000.bin/"
                          f".idx exists. Check the path, or build them: python -m data_pipeline.preprocess --input "
                          f"CORPUS --tokenizer {cfg.data.tokenizer} --output-prefix {prefix} --append-eod")
            tokens = 0
            for shard in shards:
                try:
                    tokens += check_shard(shard).tokens
                except ShardError as err:
                    fail(key, str(err))
            if split == "train" and tokens < cfg.data.seq_len + 1:
                fail(key, f"the train split of {prefix!r} holds {tokens} tokens, fewer than one sample "
                          f"(data.seq_len + 1 = {cfg.data.seq_len + 1})")
        if not cfg.data.allow_tokenizer_mismatch:
            check_shard_tokenizer(cfg, prefix, fail)


def check_shard_tokenizer(cfg: Config, prefix: str, fail) -> None:
    """The shards' _stats.json names the tokenizer they were built with: the config's must be the
    same file, or a file with the same vocabulary (e.g. its uncompressed copy)."""
    import json

    from data_pipeline.plan import file_sha256
    from data_pipeline.tokenizer import load_tokenizer

    stats_path = Path(f"{prefix}_stats.json")
    if not stats_path.is_file():
        return
    try:
        stats = json.loads(stats_path.read_text())
        built_with, built_sha = stats["tokenizer"], stats["tokenizer_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # an older or foreign stats file: nothing recorded to compare
    ours = load_tokenizer(cfg.data.tokenizer)
    ours_sha = file_sha256(ours.path)
    if ours_sha == built_sha:
        return
    try:
        same = load_tokenizer(built_with).vocabulary() == ours.vocabulary()
    except (OSError, ValueError):
        same = False  # the shards' tokenizer is not here to compare vocabularies with
    if not same:
        fail("data.tokenizer", f"{cfg.data.tokenizer} (sha256 {ours_sha[:12]}) is not the tokenizer the shards "
                               f"{prefix}_* were built with: {stats_path} names {built_with} (sha256 "
                               f"{built_sha[:12]}), whose token ids mean other tokens. Point data.tokenizer at that "
                               "tokenizer, rebuild the shards with this one, or set "
                               "data.allow_tokenizer_mismatch=true to train anyway")


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
        fail("task.catbabi.folder", f"no folder {c.folder}: put the bAbI v1.2 task files there (README: catbAbI)")
    for split in ("train", c.eval_split):
        try:
            split_files(c.folder, split)
        except FileNotFoundError as err:
            fail("task.catbabi.folder" if split == "train" else "task.catbabi.eval_split", str(err))
    if not check_data:
        return
    from implicit_megatron.train.catbabi_task import load_vocabulary, windows

    words = len(load_vocabulary(c.folder, c.split_answers))
    if cfg.model.vocab_size < words:
        fail("model.vocab_size", f"{cfg.model.vocab_size} is smaller than the catbAbI vocabulary of {c.folder} "
                                 f"({words} words); set model.vocab_size >= {words}")
    for split in ("train", c.eval_split):
        try:
            windows(c.folder, split, c.split_answers, cfg.data.seq_len, None)
        except ValueError as err:
            fail("data.seq_len", str(err))
