"""Per-rank entry: python -m implicit_megatron.train CONFIG [key=value ...]."""

from __future__ import annotations

import argparse
import os
import sys

from implicit_megatron.config import load_config
from implicit_megatron.utils.typed_yaml import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m implicit_megatron.train")
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # LOCAL_RANK is used
    args = parser.parse_args(argv)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        cfg = load_config(args.config, args.overrides, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    if "RANK" not in os.environ:  # a plain `python -m` run: a world of one process
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29500"))
    from implicit_megatron.train.loop import Trainer

    Trainer(cfg).fit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
