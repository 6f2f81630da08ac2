"""The run config as typed dataclasses: every key, its type and default (the sections below).
Plain data: nothing here reads a file.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from typing import Literal, get_args, get_type_hints

from implicit_megatron.models.llama.spec import LlamaSettings
from implicit_megatron.models.mamba2.spec import Mamba2Settings
from implicit_megatron.utils.domains import PROBABILITY, SEED, domain
from implicit_megatron.utils.typed_yaml import to_dict

MAX_MINUTES = 525_600.0  # a year: the longest wait a timeout may name (threads and timedelta take no more)

# --------------------------------------------------------------------------- sections


@dataclass
class ModelConfig:
    arch: Literal["mamba2", "llama"] = "mamba2"  # the backbone (models.registry): its block, and its section below
    d_model: int = domain(768, gt=0)  # width of the residual stream (Table 6)
    n_layers: int = domain(24, gt=0)  # blocks in one application of the backbone F (Table 6)
    vocab_size: int = domain(50277, gt=0)  # the GPT-NeoX-20B tokenizer
    pad_vocab_multiple: int = domain(1, gt=0)  # Mamba2 recipe: 16
    norm_eps: float = domain(1e-5, gt=0)  # epsilon of every RMSNorm
    init_std: float = domain(0.02, ge=0)  # the embedding's (and, with init: default, Llama's Linear layers')
    # default: mamba_ssm's init for Mamba2, GPT-2/Megatron's N(0, init_std) for Llama; released: the
    # released models' (PyTorch's default Linear init, residual rescale only without weight norm)
    init: Literal["default", "released"] = "default"
    residual_in_fp32: bool = False  # each block's residual sum in at least float32 (the released models)
    # dropout on the embeddings in training (the released state-tracking model: 0.05)
    embedding_dropout: float = domain(0.0, ge=0, lt=1, what="a probability")
    tie_embeddings: bool = True  # the output head reads the embedding's weights
    use_kernels: bool = True  # fused mamba_ssm / causal_conv1d / flash-attn when importable and on GPU
    separate_documents: bool = False  # packed documents share no state or attention (paper: off)
    mamba2: Mamba2Settings = field(default_factory=Mamba2Settings)
    llama: LlamaSettings = field(default_factory=LlamaSettings)

    @property
    def padded_vocab_size(self) -> int:
        return math.ceil(self.vocab_size / self.pad_vocab_multiple) * self.pad_vocab_multiple


@dataclass
class AndersonSettings:
    enabled: bool = False  # Anderson acceleration of the solver's passes instead of plain ones
    window: int = domain(5, gt=0)  # past iterates the Anderson step mixes
    regularization: float = domain(1e-4, ge=0)  # ridge term of its least-squares solve
    mixing: float = domain(1.0, gt=0)  # beta of the Anderson update


@dataclass
class SolverSettings:
    """What the fixed-point solve reads, in one place: the implicit.* keys of a config (ImplicitConfig
    is one) or, in a curriculum, those with the phase's own keys (PHASE_SOLVER_KEYS) put in. The
    implicit core holds one and a phase replaces its keys; implicit.iteration's stop rules are made
    from it."""

    # s: the cap on passes without gradient (a phase of the curriculum sets its own)
    max_iter: int = domain(4, ge=1, unit="passes")
    tol: float | None = domain(None, gt=0, what="a tolerance")  # None: a bounded phase, exactly max_iter passes
    phantom_steps: int = domain(1, ge=1, unit="passes")  # k: damped passes with gradient after the solve
    damping: float = domain(0.8, gt=0, le=1)  # lambda of the phantom step z <- (1-l) z + l F(z)
    eval_factor: int = domain(4, ge=1)  # evaluation caps the passes at max_iter * eval_factor
    # the evaluation cap itself, instead (released: eval_f_max_iter)
    eval_max_iter: int | None = domain(None, ge=1, unit="passes")
    # released: the paper's evaluation (damped passes, one stop test over the whole batch, a last
    # undamped pass; implicit.solver.solve_rule); solver: the training solver's own passes
    eval_rule: Literal["released", "solver"] = "released"
    # A bounded phase's evaluation stops at eval_tol (as the released (4+1) models are evaluated);
    # null evaluates it at its fixed depth max_iter. Free phases evaluate at their own tol.
    eval_tol: float | None = domain(0.05, gt=0, what="a tolerance")
    # simultaneous-mode evaluation: token = each position stops at its own residual, so a position's
    # result depends on the tokens up to it alone (not on the batch, padding or what follows);
    # sequence = each sequence stops at its own residual; batch = the released code's one stop test
    # over the batch (a sequence's result depends on its neighbours), for paper-fidelity evaluation.
    # Training always uses the batch-wide rule.
    eval_stop: Literal["token", "sequence", "batch"] = "token"
    # sequential mode (generation): row = each row stops at its own residual, frozen while the others
    # iterate (its tokens and passes are those it has alone); batch = the released code's one stop test
    # over the batch, to reproduce its runs on batches
    sequential_stop: Literal["row", "batch"] = "row"
    # sequential mode: start token t's solve from token t-1's fixed point instead of zero
    warm_start: bool = False
    # unrolled: backprop through max_iter passes; unrolled_damped: F(0), then max_iter - 1 damped passes
    gradient: Literal["phantom", "unrolled", "unrolled_damped"] = "phantom"
    anderson: AndersonSettings = field(default_factory=AndersonSettings)

    def stop_tol(self, training: bool) -> float | None:
        """The tolerance the solver stops at: the phase's own; a bounded phase's evaluation stops at
        eval_tol (the released (4+1) models are evaluated at 0.05), or never (fixed depth)."""
        return self.tol if training or self.tol is not None else self.eval_tol

    def cap(self, training: bool) -> int:
        """Passes allowed: max_iter in training; an evaluation that stops at a tolerance allows
        eval_max_iter or eval_factor x max_iter, a fixed-depth evaluation exactly max_iter."""
        if training or self.stop_tol(False) is None:
            return self.max_iter
        return self.eval_max_iter or self.max_iter * self.eval_factor


@dataclass
class ImplicitConfig(SolverSettings):
    """(s+k): at most `max_iter` passes without gradient, then `phantom_steps` with it."""

    enabled: bool = False  # false: the explicit baseline (one pass, no injection)
    injection: bool = True  # the shared input-injection module
    weight_norm: bool = False  # weight normalisation of the backbone's Linear and Conv1d layers (released)
    weight_norm_injection: bool = False  # weight norm on the injection's Linear too (released)
    # CUDA graphs of the passes (implicit.graphs): auto = where possible, else eager with one log line
    cuda_graphs: Literal["auto", "on", "off"] = "auto"


EVAL_STOPS: tuple[str, ...] = get_args(get_type_hints(ImplicitConfig)["eval_stop"])  # named by evaluation tools

@dataclass
class DataConfig:
    # tokenizer.json[.xz], sentencepiece .model, or a folder holding one
    tokenizer: str = "data/tokenizers/gpt-neox-20b.json.xz"
    prefixes: list[str] = field(default_factory=list)  # shard prefixes, read as {prefix}_{split}
    weights: list[float] | None = domain(None, ge=0)  # blending weights, one per prefix
    seq_len: int = domain(2048, gt=0, unit="tokens")  # tokens per training sample
    seed: int = domain(1234, **SEED)  # seed of the sample order (and of the word problem's words)
    source: str | None = None  # raw text to build missing shards from (the quickstart corpus)
    # train although data.tokenizer is not the tokenizer the shards were built with (their _stats.json)
    allow_tokenizer_mismatch: bool = False
    # the packed-sample index cache, a folder of this user's; null: under $XDG_CACHE_HOME
    # (~/.cache)/implicit-megatron/index-cache/ (an index-cache/ beside the shards is never read)
    index_cache: str | None = None
    # the pre-launch check reads every shard file and compares its sha256 with the one {prefix}_stats.json
    # records (a flipped bit is seen); costs one read of the data (~1-2 GB/s: minutes for the Pile)
    verify_shards: bool = False


@dataclass
class WordProblemConfig:
    """State tracking (data_pipeline.synthetic.word_problem): words of data.seq_len elements, labelled
    with their prefix products at every position; made on the fly from data.seed."""

    algebra: str = "Ma_A5"  # S5, A5, S3, A4, Z<m> (Z2: parity), or Ma_<group> (data_pipeline.synthetic.algebra)
    # probability that a token's group part is not the identity; None: uniform over G
    p: float | None = domain(0.1, **PROBABILITY)
    eval_p: float | None = domain(0.5, **PROBABILITY)  # the out-of-distribution evaluation (paper: 0.5)
    eval_lengths: list[int] = domain(default_factory=list, gt=0)  # longer words, evaluated at p
    eval_words: int = domain(256, gt=0)  # words per evaluation set
    # released: p and eval_p as the released data script writes them (the probability that a token's
    # group part is forced to the identity, otherwise uniform over G): read as (1 - p)(|G| - 1)/|G|
    p_convention: Literal["paper", "released"] = "paper"


@dataclass
class CatbabiConfig:
    """catbAbI (train.tasks.catbabi): the bAbI stories of `folder` as one stream in windows of
    data.seq_len + 1, the loss and accuracy on answer tokens; validation also per task."""

    folder: str = "data/catbabi"  # qa<N>_*_{train,valid,test}.txt of bAbI v1.2 (en-valid-10k), or converted files
    eval_split: Literal["valid", "test"] = "valid"  # the split validation reads
    split_answers: bool = False  # task 19's "n,w" as two answer tokens instead of one word


@dataclass
class TaskConfig:
    kind: Literal["language_model", "word_problem", "catbabi"] = "language_model"  # what the run learns
    word_problem: WordProblemConfig = field(default_factory=WordProblemConfig)
    catbabi: CatbabiConfig = field(default_factory=CatbabiConfig)


@dataclass
class OptimizerConfig:
    lr: float = domain(3e-3, gt=0)  # peak learning rate of AdamW
    betas: tuple[float, float] = domain((0.9, 0.95), ge=0, lt=1)  # AdamW's betas
    eps: float = domain(1e-8, gt=0)  # AdamW's epsilon
    # decoupled weight decay, except on norms, biases, embeddings, A_log, D, dt_bias
    weight_decay: float = domain(0.1, ge=0)
    grad_clip: float = domain(1.0, ge=0)  # global gradient norm clipping (0: off)


@dataclass
class ScheduleConfig:
    """Linear warmup -> constant -> 1 - sqrt cooldown to min_lr (over the whole curriculum)."""

    warmup_steps: int = domain(2000, ge=0, unit="steps")  # linear warmup from 0 to optimizer.lr
    # fraction of train.steps (Llama: start of the free phase)
    cooldown_start: float = domain(0.9, ge=0, le=1, what="a fraction")
    min_lr: float = domain(1e-5, ge=0)  # where the cooldown ends
    cooldown: Literal["sqrt", "linear", "cosine"] = "sqrt"  # the shape of the decay to min_lr


@dataclass
class PhaseLaunchConfig:
    """How launch/curriculum.sh starts a phase; unset values keep the environment's (NUM_NODES, ...)."""

    num_nodes: int | None = domain(None, gt=0)  # nodes of this phase's launch
    processes_per_node: int | None = domain(None, gt=0)  # GPUs per node; CPU processes where there is no GPU
    hostfile: str | None = None  # DeepSpeed hostfile of this phase's launch


@dataclass
class PhaseConfig:
    name: str = domain(name=True)  # the phase's name (checkpoint tags are <name>-step<N>)
    # bounded: exactly max_iter passes; free: stops at tol; unrolled: the released warm-up, F(0) then
    # max_iter - 1 damped passes with backpropagation through all of them (phantom_steps 0)
    kind: Literal["bounded", "free", "unrolled"] = domain()
    fraction: float = domain(gt=0, le=1, what="a fraction")  # share of train.steps
    max_iter: int = domain(ge=1, unit="passes")  # s: passes without gradient (the cap in a free phase)
    phantom_steps: int = domain(ge=0, unit="passes")  # k: damped passes with gradient
    tol: float | None = domain(None, gt=0, what="a tolerance")  # required in a free phase, forbidden in a bounded one
    # A phase run as a launch of its own (curriculum.run_phase) may change these:
    zero_stage: Literal[0, 1, 2, 3] | None = None  # replaces distributed.zero_stage
    micro_batch_size: int | None = domain(None, gt=0)  # replaces train.micro_batch_size
    launch: PhaseLaunchConfig = field(default_factory=PhaseLaunchConfig)

    def solver_keys(self) -> dict:
        """What this phase sets of the solver's settings (PHASE_SOLVER_KEYS), and nothing else."""
        return {key: getattr(self, key) for key in PHASE_SOLVER_KEYS}


@dataclass
class CurriculumConfig:
    # (s+k) phases in order, their fractions adding up to 1; empty: implicit.* throughout
    phases: list[PhaseConfig] = field(default_factory=list)
    run_phase: str | None = None  # None: every phase in one launch


@dataclass
class DistributedConfig:
    zero_stage: Literal[0, 1, 2, 3] = 1  # DeepSpeed ZeRO stage
    # DeepSpeed's training precision (float32 optimizer masters with bf16/fp16)
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    activation_checkpointing: bool = False  # recompute each block in backward (no CUDA graphs then)
    backend: Literal["auto", "nccl", "gloo"] = "auto"  # torch.distributed backend; auto: nccl with GPUs, gloo without
    # the longest a rank may give no sign of life (stopped, hung, cut off) before the stall watch ends the job
    # naming it: the one judge of a stall. A living rank's step, validation or save may take any time
    timeout_minutes: float = domain(10.0, gt=0, le=MAX_MINUTES, unit="minutes")
    # the backstop above the watch: the longest one collective or rendezvous-store call waits (living ranks
    # that never meet, which no heartbeat shows), and how long the watch waits for a store that does not
    # answer (a suspended launcher, a lost host) before it ends the job
    collective_timeout_minutes: float = domain(1440.0, gt=0, le=MAX_MINUTES, unit="minutes")


@dataclass
class CheckpointConfig:
    # steps between checkpoints (and one at each phase's end and the run's)
    interval: int = domain(1000, gt=0, unit="steps")
    # checkpoints kept (besides the best-validated and a diverging run's last good one)
    keep_last: int = domain(3, ge=0)
    load: str | None = None  # start from this checkpoint folder (phase handoff, fine-tuning)
    load_optimizer: bool = True  # restore the optimizer state from the checkpoint started from
    load_data_state: bool = True  # restore the data position at a handoff or load (a resume always does)
    allow_data_change: bool = False  # resume although data, sequence length or batch size changed
    # a damaged newest checkpoint (or `latest`): resume from the newest complete one, or refuse
    on_damaged: Literal["fallback", "fail"] = "fallback"
    # no checkpoint at a step whose loss exceeds this factor x the mean of the previous 20 steps' (null: off)
    max_loss_jump: float | None = domain(4.0, gt=1)
    # load checkpoint files that need more than the weights-only unpickler (their pickles may run code)
    trust_pickle: bool = False
    # resume from a tag in this run's checkpoints that another run saved, or whose step is not its name's
    accept_foreign_checkpoint: bool = False


@dataclass
class WandbConfig:
    project: str | None = None  # None: no Weights & Biases (the `wandb` extra installs it)
    mode: Literal["offline", "online"] = "offline"  # offline: <output_dir>/wandb, uploaded by `wandb sync`
    entity: str | None = None  # Weights & Biases team or user


@dataclass
class TrackingConfig:
    enabled: bool = True  # MLflow
    uri: str | None = None  # None: MLFLOW_TRACKING_URI, else a local sqlite store in train.output_dir
    # MLflow experiment name (unset: MLFLOW_EXPERIMENT_NAME, else this)
    experiment: str = domain("implicit-megatron", name=True)
    # CPU, memory, disk, network and GPU use as MLflow system metrics (MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING too)
    system_metrics: bool = False
    tensorboard: bool = False  # every metric also into <output_dir>/tensorboard/ (rank 0)
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class TrainConfig:
    output_dir: str | None = None  # None: runs/<name>
    steps: int = domain(1000, gt=0)  # optimizer steps over the whole curriculum
    global_batch_size: int = domain(512, gt=0)  # sequences per optimizer step (512 x 2048 = 1M tokens)
    # sequences per forward on one process (accumulation makes up the global batch)
    micro_batch_size: int = domain(8, gt=0)
    log_interval: int = domain(10, gt=0, unit="steps")  # steps per log line and metrics record
    eval_interval: int = domain(1000, gt=0, unit="steps")  # steps between validations (and one at the end)
    # validation windows per evaluation, whatever the micro batch and world size
    eval_samples: int = domain(160, ge=0)
    seed: int = domain(1234, **SEED)  # seed of initialisation and dropout
    max_nonfinite_in_row: int = domain(10, ge=1)  # non-finite steps in a row that stop the run (exit 1)
    # warn when no solve converged in this many log intervals (0: never)
    warn_unconverged_intervals: int = domain(5, ge=0)
    # per device, for MFU; None: looked up from the GPU's name
    peak_tflops: float | None = domain(None, gt=0, unit="TFLOP/s")
    compile: bool = False  # torch.compile each backbone block (Backbone.compile_blocks)
    timers: bool = False  # log where a step's time goes; synchronises the device between sections
    # save and stop (exit 0, run-end.json: stopped) this long after start
    exit_after_minutes: float | None = domain(None, gt=0, le=MAX_MINUTES, unit="minutes")


@dataclass
class Config:
    name: str = domain("run", name=True)  # the run's name: runs/<name> unless train.output_dir
    model: ModelConfig = field(default_factory=ModelConfig)
    implicit: ImplicitConfig = field(default_factory=ImplicitConfig)
    data: DataConfig = field(default_factory=DataConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # where the config came from: set when it is read, never a key of a file or of the command line
    source: str = field(default="", init=False, repr=False, compare=False)  # the file it was loaded from
    sources: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # which file set each key
    overrides: list = field(default_factory=list, init=False, repr=False, compare=False)  # the command line's

    @property
    def output_dir(self) -> str:
        return self.train.output_dir or os.path.join("runs", self.name)

    def to_dict(self) -> dict:
        """The config as saved with a run (config.yaml, checkpoints, exports, MLflow): without where it
        came from, and without the command-line-only switches (COMMAND_LINE_ONLY)."""
        data = to_dict(self)
        for where in ("source", "sources", "overrides"):
            data.pop(where)
        for dotted in COMMAND_LINE_ONLY:
            section, key = dotted.split(".")
            data[section].pop(key)
        if data["curriculum"]["phases"]:  # each phase sets its own: a saved config loads again (config.rules)
            for key in PHASE_SOLVER_KEYS:
                data["implicit"].pop(key)
        return data


# What every phase of a curriculum sets for itself: its fields that are the solver's (the phase declares them
# required, where implicit.* has defaults)
PHASE_SOLVER_KEYS = tuple(f.name for f in fields(PhaseConfig) if f.name in {g.name for g in fields(SolverSettings)})

# Switches that make a launch trust what it loads (a pickle that runs code, a checkpoint of another
# run): a launch's own decision, so taken from its command line only (config.rules refuses them in a
# file) and never saved with the run, where a copy of its config would carry them to the next launch.
COMMAND_LINE_ONLY = ("checkpoint.trust_pickle", "checkpoint.accept_foreign_checkpoint")
