"""Convert checkpoints of implicit_megatron.train.

    python tools/convert_checkpoint.py export CKPT_DIR OUT_DIR [--tag T] [--dtype fp32|bf16] [--tokenizer FILE]
    python tools/convert_checkpoint.py import SRC OUT_DIR [--base-config CONFIG] [--tokenizer FILE]
    python tools/convert_checkpoint.py universal CKPT_DIR [--tag T]

`export` writes model.safetensors + config.json + the tokenizer file, a folder that
`implicit_megatron.from_pretrained(OUT_DIR)` and, after `import implicit_megatron`, transformers'
AutoModelForCausalLM load. CKPT_DIR is a run's `checkpoints/` folder. The tokenizer copied is the
config's data.tokenizer where it lies in this repository's data/ or the run folder; one elsewhere
(the working directory included: a received config may name a private file) only when --tokenizer
names it.
`import` reads an explicit Mamba2 (transformers or mamba_ssm) or Llama (transformers) folder and
writes the same kind of folder; with an implicit --base-config the injection starts fresh. It also
reads the models released with the paper (implicit, "(4+1) pretrain" and explicit; model_type
implicit_llama3 / implicit_mamba2), weight norm, solver settings and evaluation rule included.
The tokenizer it publishes is the model's own: --tokenizer, else the source folder's
tokenizer.json or tokenizer.model, else --base-config's data.tokenizer, else the one the source's
config.json names where this repository ships it (the released models: GPT-NeoX-20B). A source
naming none is refused, and so is a tokenizer with ids past the model's vocabulary.
`export --format released` writes a folder the released code loads.
`universal` converts one checkpoint (ZeRO 1-3, or bf16) to a DeepSpeed universal checkpoint in
CKPT_DIR/TAG/universal. Training does this by itself when it starts at another world size or ZeRO
stage; the command is for doing it ahead of time, or for other DeepSpeed programs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    """The command; Ctrl-C at any point is one line and exit 130 (what it was writing is removed:
    an export appears only once whole, a universal conversion is renamed into place only when done)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("convert_checkpoint: stopped by Ctrl-C: nothing was written (a folder there before is as it was; "
              "the checkpoint read is intact)", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    exp = commands.add_parser("export", help="consolidated safetensors + config.json")
    exp.add_argument("ckpt_dir", help="a run folder, its checkpoints/ folder or one tag folder")
    exp.add_argument("out_dir")
    exp.add_argument("--tag", default=None, help="checkpoint tag (default: the one 'latest' names)")
    exp.add_argument("--dtype", choices=("fp32", "bf16", "fp64"), default=None,
                     help="default: fp32 (ours), the stored dtype (released)")
    exp.add_argument("--format", choices=("ours", "released"), default="ours",
                     help="released: the folder the paper's released code loads (CKPT_DIR may also be one of "
                          "our model folders)")
    imp = commands.add_parser("import", help="weights of an explicit Mamba2 or Llama folder")
    imp.add_argument("src")
    imp.add_argument("out_dir")
    imp.add_argument("--base-config", default=None, help="our config for everything but the model's shape")
    uni = commands.add_parser("universal", help="a DeepSpeed universal checkpoint of one tag")
    uni.add_argument("ckpt_dir", help="a run folder, its checkpoints/ folder or one tag folder")
    uni.add_argument("--tag", default=None, help="checkpoint tag (default: the one 'latest' names)")
    uni.add_argument("--workers", type=int, default=4, help="processes that extract the ZeRO shards")
    exp.add_argument("--tokenizer", default=None,
                     help="the tokenizer file to copy into the folder (default: the config's data.tokenizer, "
                          "where it lies in this repository's data/ or the run folder)")
    imp.add_argument("--tokenizer", default=None,
                     help="the tokenizer the model was trained with (default: the source folder's tokenizer.json "
                          "or tokenizer.model, else --base-config's data.tokenizer, else the one the source's "
                          "config.json names where this repository ships it)")
    for sub in (exp, imp, uni):
        sub.add_argument("--trust-checkpoint", action="store_true",
                         help="load checkpoint files whose pickles need more than tensors (their code runs)")
    args = parser.parse_args(argv)
    from implicit_megatron.utils.output_paths import output_problem

    problem = output_problem(args.out_dir, folder=True) if hasattr(args, "out_dir") else None
    if problem:
        print(f"convert_checkpoint: {args.out_dir}: {problem}", file=sys.stderr)
        return 2
    import torch

    from implicit_megatron.checkpoints import safe_load

    safe_load.set_trust(args.trust_checkpoint)
    from implicit_megatron.checkpoints.universal import universal_of
    from implicit_megatron.hf.export import export
    from implicit_megatron.hf.import_explicit import import_explicit
    from implicit_megatron.hf.released import export_released_from, import_released, is_released
    from implicit_megatron.utils.json_config import read_json_config

    try:
        if args.command == "export" and args.format == "released":
            dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}.get(args.dtype)
            out = export_released_from(args.ckpt_dir, args.out_dir, tag=args.tag, dtype=dtype)
        elif args.command == "export":
            out = export(args.ckpt_dir, args.out_dir, tag=args.tag, dtype=args.dtype or "fp32",
                         tokenizer=args.tokenizer)
        elif args.command == "import":
            described = Path(args.src) / "config.json"
            source = read_json_config(described) if described.is_file() else {}
            if is_released(source):  # the paper's released implicit, (4+1) and explicit models
                out = import_released(args.src, args.out_dir, args.base_config, args.tokenizer)
            else:
                out = import_explicit(args.src, args.out_dir, args.base_config, args.tokenizer)
        else:
            out = universal_of(args.ckpt_dir, args.tag, args.workers)
    except (OSError, ValueError, RuntimeError) as err:
        print(f"convert_checkpoint: {err}", file=sys.stderr)
        return 2
    source = read_json_config(out / "config.json").get("tokenizer_source") if (out / "config.json").is_file() else None
    print(f"{args.command} -> {out}" + (f" (tokenizer copied from {source})" if source else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
