"""The kinds of received files tools/dev/fuzz_received.py attacks: for each, a valid artifact, the
project's reader of it, and the reader's own errors."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
from fuzz_received import Kind

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "data" / "tokenizers" / "shakespeare-bpe-1000.json.xz"
TEXTS = ["ROMEO: But soft, what light through yonder window breaks?", "It is the east, and Juliet is the sun.",
         "Arise, fair sun, and kill the envious moon,", "Who is already sick and pale with grief."]


# ------------------------------------------------------------------ shards with their stats


def make_shards(folder: Path, outside: Path) -> Path:
    """A build of data_pipeline.preprocess: three splits and a _stats.json with each file's digest."""
    from data_pipeline.preprocess import main as preprocess

    corpus = outside / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"{t} {i}"}) + "\n" for i in range(60) for t in TEXTS))
    prefix = folder / "shards" / "bpe"
    code = preprocess(["--input", str(corpus), "--tokenizer", str(TOKENIZER), "--output-prefix", str(prefix),
                       "--workers", "0", "--append-eod", "--valid-fraction", "0.1", "--test-fraction", "0.1",
                       "--quiet"])
    assert code == 0, "preprocessing the fuzzer's corpus failed"
    return prefix


def read_shards(prefix: Path) -> object:
    """What training and evaluation read: the build checked with its digests (data.verify_shards),
    each shard checked, then every document's tokens through megatron-core's reader."""
    from data_pipeline.indexed import find_shards, megatron_indexed
    from data_pipeline.shard_check import check_build, check_shard

    check_build(str(prefix), verify=True)
    indexed_cls, _ = megatron_indexed()
    digest = hashlib.sha256()
    for split in ("train", "valid", "test"):
        for shard in find_shards(str(prefix), split):
            if check_shard(shard).tokens:
                dataset = indexed_cls(shard)
                for i in range(len(dataset)):
                    digest.update(np.asarray(dataset[i], dtype=np.int64).tobytes())
                del dataset
    return digest.hexdigest()


def shard_files(prefix: Path) -> list[Path]:
    return sorted(p for p in prefix.parent.iterdir() if p.name.startswith(prefix.name + "_"))


def shard_errors() -> tuple[type[BaseException], ...]:
    from data_pipeline.shard_check import ShardError

    return (ShardError, FileNotFoundError)


# ------------------------------------------------------------------ a tokenizer received with shards


def make_tokenizer(folder: Path, outside: Path) -> Path:
    """The shards' tokenizer as an export writes it (tokenizer.json) and the shards' record of it."""
    from data_pipeline.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(TOKENIZER)
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "shards").mkdir()
    record = {"tokenizer": str(TOKENIZER), "tokenizer_sha256": "0" * 64, "tokenizer_identity": tokenizer.identity()}
    (folder / "shards" / "bpe_stats.json").write_text(json.dumps(record))
    return folder / "tokenizer.json"


def read_tokenizer(path: Path) -> object:
    """What evaluation does with an export's tokenizer and the shards it is given: load it, refuse it
    where it is not the shards' (by what it does), then encode and decode."""
    from data_pipeline.shard_tokenizer import other_tokenizer
    from data_pipeline.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(path)
    problem = other_tokenizer(str(path.parent / "shards" / "bpe"), str(path))
    if problem:
        raise ValueError(problem)
    ids = tokenizer.encode_batch(TEXTS)
    return tokenizer.vocab_size, tokenizer.eod_id, ids, [tokenizer.decode(i) for i in ids]


# ------------------------------------------------------------------ a named index cache


SEQ = 16


def make_index_cache(folder: Path, outside: Path) -> Path:
    """One shard of distinct tokens and its packed-sample indices in a cache of this user's."""
    from data_pipeline.indexed import finalize, megatron_indexed
    from data_pipeline.packed import build_packed_dataset

    _, builder_cls = megatron_indexed()
    builder = builder_cls(str(folder / "a_train.bin"), dtype=np.uint16)
    rng, start = np.random.default_rng(0), 0
    for length in rng.integers(3, 40, size=40):
        builder.add_document(np.arange(start, start + length, dtype=np.uint16), [int(length)])
        start += int(length)
    finalize(builder, str(folder / "a_train.idx"))
    (folder / "cache").mkdir(mode=0o700)
    build_packed_dataset([str(folder / "a")], None, "train", SEQ, seed=1, num_samples=100,
                         cache_dir=str(folder / "cache"))
    return folder / "cache"


def read_index_cache(cache: Path) -> object:
    from data_pipeline.packed import build_packed_dataset

    data = build_packed_dataset([str(cache.parent / "a")], None, "train", SEQ, seed=1, num_samples=100,
                                cache_dir=str(cache))
    return [data[i].tolist() for i in range(len(data))]


def cache_files(cache: Path) -> list[Path]:
    return sorted(cache.iterdir())


def cache_errors() -> tuple[type[BaseException], ...]:
    from data_pipeline.shard_check import ShardReadError

    return (ShardReadError,)


# ------------------------------------------------------------------ a checkpoint tag


def make_checkpoint(folder: Path, outside: Path) -> Path:
    """A tag as the trainer saves one with ZeRO stage 0 on one rank: model states, random states and
    the manifest written once both are."""
    import torch

    from implicit_megatron.checkpoints.integrity import write_manifest
    from implicit_megatron.deepspeed_internals import MODEL_STATES

    tag = folder / "checkpoints" / "bounded-step4"
    tag.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    module = {"embed.weight": torch.randn(16, 8, generator=generator), "norm.weight": torch.ones(8)}
    torch.save({"module": module, "config": {"distributed": {"zero_stage": 0, "precision": "fp32"}},
                "dp_world_size": 1, "global_steps": 4}, tag / MODEL_STATES)
    torch.save({"torch": torch.get_rng_state(), "step": 4}, tag / "rng_rank0.pt")
    write_manifest(tag)
    (tag.parent / "latest").write_text(tag.name + "\n")
    return tag.parent


def read_checkpoint(checkpoints: Path) -> object:
    """What a resume does before DeepSpeed loads anything: the tag `latest` names, found and checked
    whole, then its weights."""
    from implicit_megatron.checkpoints import safe_load
    from implicit_megatron.checkpoints.integrity import check_tag
    from implicit_megatron.checkpoints.layout import find_checkpoint, tag_dir
    from implicit_megatron.deepspeed_internals import MODEL_STATES

    folder, tag = find_checkpoint(checkpoints)
    check_tag(tag_dir(folder, tag), crc=True)
    saved = safe_load.load(tag_dir(folder, tag) / MODEL_STATES, map_location="cpu")
    return {name: tensor.tolist() for name, tensor in saved["module"].items()}


def checkpoint_files(checkpoints: Path) -> list[Path]:
    return [checkpoints / "latest", *sorted((checkpoints / "bounded-step4").iterdir())]


def checkpoint_errors() -> tuple[type[BaseException], ...]:
    from implicit_megatron.checkpoints.layout import DamagedCheckpoint
    from implicit_megatron.checkpoints.safe_load import UnsafeCheckpoint

    return (DamagedCheckpoint, UnsafeCheckpoint, FileNotFoundError)


# ------------------------------------------------------------------ an exported folder


def make_export(folder: Path, outside: Path) -> Path:
    """A tiny explicit Mamba2 as tools/convert_checkpoint.py export writes it."""
    import torch

    from implicit_megatron import build_model, load_config
    from implicit_megatron.hf.export import write_folder

    cfg = load_config(ROOT / "configs" / "tiny" / "mamba2-explicit.yaml",
                      ["model.d_model=32", "model.mamba2.headdim=8", f"data.tokenizer={TOKENIZER}"])
    torch.manual_seed(0)
    return write_folder(folder / "export", build_model(cfg).eval(), cfg, torch.float32, TOKENIZER)


def read_export(folder: Path) -> object:
    """What evaluation, generation and transformers' load do first: the folder read and checked,
    the model built from it and its weights loaded."""
    from implicit_megatron.hf.export import from_pretrained

    model = from_pretrained(folder)
    return {name: tensor.tolist() for name, tensor in model.state_dict().items()}


def export_files(folder: Path) -> list[Path]:
    return [folder / "config.json", folder / "model.safetensors"]


def export_errors() -> tuple[type[BaseException], ...]:
    from implicit_megatron.checkpoints.weights_file import WeightsFileError
    from implicit_megatron.utils.typed_yaml import ConfigError

    return (ConfigError, WeightsFileError, ValueError, FileNotFoundError)


# ------------------------------------------------------------------ a YAML config and its base


def make_config(folder: Path, outside: Path) -> Path:
    for name in ("mamba2-explicit.yaml", "mamba2-implicit.yaml"):
        shutil.copy(ROOT / "configs" / "tiny" / name, folder / name)
    return folder / "mamba2-implicit.yaml"


def read_config(path: Path) -> object:
    from implicit_megatron import load_config
    from implicit_megatron.utils.typed_yaml import to_dict

    return to_dict(load_config(path, ["data.source=null", "data.prefixes=[x]"]))


def config_files(path: Path) -> list[Path]:
    return [path, path.parent / "mamba2-explicit.yaml"]


def config_errors() -> tuple[type[BaseException], ...]:
    from implicit_megatron.utils.typed_yaml import ConfigError

    return (ConfigError,)


# ------------------------------------------------------------------ a hostfile


def make_hostfile(folder: Path, outside: Path) -> Path:
    path = folder / "hostfile"
    path.write_text("# two nodes\nnode1 slots=8\nnode2 slots=8\n\n10.0.0.3 slots=4\n")
    return path


def read_hostfile(path: Path) -> object:
    from implicit_megatron.launch.hostfile import read_hostfile as read

    return read(path)


def hostfile_errors() -> tuple[type[BaseException], ...]:
    from implicit_megatron.launch.hostfile import HostfileError

    return (HostfileError,)


# ------------------------------------------------------------------ a launch's environment file


def make_env_file(folder: Path, outside: Path) -> Path:
    home = folder / "home"
    home.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_DEBUG=INFO\nNCCL_SOCKET_IFNAME=eth0\nPYTHONPATH=/opt/code\n")
    return home


def read_env_file(home: Path) -> object:
    """What a multi-node launch hands every node's shell: refused by name where a shell would run it."""
    from implicit_megatron.launch.environment import LaunchError
    from implicit_megatron.launch.node_shell import environment_file, problems

    found = problems({}, home, home)
    if found:
        raise LaunchError("\n".join(found))
    return environment_file({}, home, home)


def env_errors() -> tuple[type[BaseException], ...]:
    from implicit_megatron.launch.environment import LaunchError

    return (LaunchError,)


KINDS: dict[str, Kind] = {
    "shards": Kind("shards", make_shards, read_shards, (), shard_files),
    "index-cache": Kind("index-cache", make_index_cache, read_index_cache, (), cache_files),
    "tokenizer": Kind("tokenizer", make_tokenizer, read_tokenizer, (ValueError, FileNotFoundError),
                      lambda p: [p]),
    "checkpoint": Kind("checkpoint", make_checkpoint, read_checkpoint, (), checkpoint_files),
    "export": Kind("export", make_export, read_export, (), export_files, changes_are_data=True),
    "config": Kind("config", make_config, read_config, (), config_files, changes_are_data=True),
    "hostfile": Kind("hostfile", make_hostfile, read_hostfile, (), lambda p: [p], changes_are_data=True),
    "env-file": Kind("env-file", make_env_file, read_env_file, (), lambda home: [home / ".deepspeed_env"],
                     changes_are_data=True),
}
ERRORS = {"shards": shard_errors, "checkpoint": checkpoint_errors, "export": export_errors, "index-cache": cache_errors,
          "config": config_errors, "hostfile": hostfile_errors, "env-file": env_errors}
for _name, _errors in ERRORS.items():
    KINDS[_name].errors = _errors()
