"""Convert checkpoints of implicit_megatron.train.

    python tools/convert_checkpoint.py export CKPT_DIR OUT_DIR [--tag T] [--dtype fp32|bf16]

`export` writes model.safetensors + config.json + the tokenizer file, a folder that
`implicit_megatron.from_pretrained(OUT_DIR)` loads. CKPT_DIR is a run's `checkpoints/` folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    exp = commands.add_parser("export", help="consolidated safetensors + config.json")
    exp.add_argument("ckpt_dir")
    exp.add_argument("out_dir")
    exp.add_argument("--tag", default=None, help="checkpoint tag (default: the one 'latest' names)")
    exp.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args(argv)
    from implicit_megatron.export import export

    try:
        out = export(args.ckpt_dir, args.out_dir, tag=args.tag, dtype=args.dtype)
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"convert_checkpoint: {err}", file=sys.stderr)
        return 2
    print(f"exported {args.ckpt_dir} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
