"""Check a run config before anything starts.

    python -m implicit_megatron.config CONFIG [key=value ...] [--world-size N]

prints the resolved config, or the first error (naming file, key and expectation)
with exit status 2. Validation runs before any process starts. A curriculum whose phases
run as launches of their own (launch/curriculum.sh) is checked phase by phase, as each
launch will load it, and printed as one YAML document per phase.
"""

from __future__ import annotations

import argparse
import sys

import yaml

from implicit_megatron.prelaunch import checked_configs
from implicit_megatron.utils.typed_yaml import ConfigError, dashed_override


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m implicit_megatron.config", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", help="the run's YAML file, e.g. configs/quickstart.yaml")
    parser.add_argument("overrides", nargs="*", help="optional dotted overrides, e.g. train.micro_batch_size=4")
    parser.add_argument("--world-size", type=int, default=None, help="data-parallel size to check batches for")
    parser.add_argument("--no-file-checks", action="store_true", help="do not open the tokenizer")
    parser.add_argument("--get", metavar="KEY", action="append",
                        help="print a resolved value (e.g. train.output_dir) instead, one line each (repeatable)")
    dashed = dashed_override(sys.argv[1:] if argv is None else argv)
    if dashed:
        print(f"python -m implicit_megatron.config: error: {dashed}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if args.config is None:
        parser.error("a config file is required, e.g. configs/quickstart.yaml (overrides are optional)")
    try:
        configs = checked_configs(args.config, args.overrides, args.world_size, check=not args.no_file_checks)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    if args.get:
        for cfg in configs:
            for key in args.get:
                value = cfg
                for part in key.split("."):
                    if not hasattr(value, part):
                        print(f"config error: no key {key!r}", file=sys.stderr)
                        return 2
                    value = getattr(value, part)
                print(value)
        return 0
    for i, cfg in enumerate(configs):
        if cfg.curriculum.run_phase is not None and len(configs) > 1:
            print(f"{'---' + chr(10) if i else ''}# phase {cfg.curriculum.run_phase!r}, as launch/curriculum.sh "
                  f"launches it (curriculum.run_phase={cfg.curriculum.run_phase})")
        yaml.safe_dump(cfg.to_dict(), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
