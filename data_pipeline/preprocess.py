"""Tokenize raw text into megatron-core IndexedDataset shards (train/valid/test).

    python -m data_pipeline.preprocess --input 'pile/*.parquet' --text-key text \\
        --tokenizer data/tokenizers/gpt-neox-20b.json.xz --output-prefix data/pile/neox \\
        --workers 63 --append-eod --test-fraction 0.001

Writes `{prefix}_{split}.bin/.idx` (or `{prefix}_{split}_{k:05d}.*` with --max-shard-tokens) and
`{prefix}_stats.json`.  Rerunning an interrupted run with the same arguments resumes it.  Bad
records are skipped and counted by reason; bad arguments stop the run before any work with exit
status 2; an input that cannot be read to its end (a cut .zst/.gz/.xz) ends it with exit status 1,
naming the file and line, after writing everything else.
"""

from __future__ import annotations

import argparse
import os
import sys

from data_pipeline.pipeline import PreprocessConfig, PreprocessError, run_preprocess
from data_pipeline.sources import FORMATS_HELP


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m data_pipeline.preprocess", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", required=True, metavar="PATH_OR_GLOB", help=FORMATS_HELP)
    parser.add_argument("--text-key", default="text", help="field holding the document text")
    parser.add_argument("--tokenizer", required=True,
                        help="tokenizer.json[.xz], sentencepiece .model, or a folder holding one")
    parser.add_argument("--output-prefix", required=True, help="e.g. data/pile/neox")
    parser.add_argument("--workers", type=int, default=1,
                        help="tokenizing processes (0: in this process); one writer either way")
    parser.add_argument("--append-eod", action="store_true", help="end every document with the EOD token")
    parser.add_argument("--eod-token", default=None,
                        help="EOD token text (default: the tokenizer's end-of-text token)")
    parser.add_argument("--valid-fraction", type=float, default=0.0)
    parser.add_argument("--test-fraction", type=float, default=0.001, help="the paper holds out 0.1%%")
    parser.add_argument("--max-shard-tokens", type=int, default=None,
                        help="cut each split into shards of at most this many tokens")
    parser.add_argument("--limit-docs", type=int, default=None, help="stop after this many documents")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def memory_limit() -> str:
    """This process's address-space limit, in words (`ulimit -v`)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return "no address-space limit" if soft == resource.RLIM_INFINITY else f"an address-space limit of " \
        f"{soft / 2**30:.2f} GiB (ulimit -v {soft // 1024})"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = PreprocessConfig(
        inputs=args.input, tokenizer=args.tokenizer, output_prefix=args.output_prefix, text_key=args.text_key,
        workers=args.workers, append_eod=args.append_eod, valid_fraction=args.valid_fraction,
        test_fraction=args.test_fraction, max_shard_tokens=args.max_shard_tokens, limit_docs=args.limit_docs,
        eod_token=args.eod_token, progress=not args.quiet)
    try:
        stats = run_preprocess(config)
    except PreprocessError as err:
        print(f"preprocess: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("preprocess: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except MemoryError as err:  # a memory limit (ulimit -v, a container's) too small for the libraries or the data
        print(f"preprocess: error: out of memory ({err or 'MemoryError'}) under {memory_limit()}; the finished inputs "
              f"are kept in {config.output_prefix}.work: raise the limit or use fewer --workers, and rerun the same "
              "command to resume", file=sys.stderr)
        return 1
    except OSError as err:  # a full or read-only disk, most often: one line, and what is kept for a rerun
        where = err.filename or f"{config.output_prefix}_* ({os.path.dirname(os.path.abspath(config.output_prefix))})"
        print(f"preprocess: error: {where}: {err.strerror or err}; the finished inputs are kept in "
              f"{config.output_prefix}.work (no shard was published): fix that and rerun the same command to "
              "resume", file=sys.stderr)
        return 1
    unreadable = stats["skipped_examples"].get("unreadable_file", [])
    if stats["skipped"].get("unreadable_file"):  # a cut or damaged input: half a corpus is not a success
        print(f"preprocess: error: {stats['skipped']['unreadable_file']} input(s) could not be read to the end "
              f"({', '.join(unreadable)}): the shards hold what was read before; repair or remove the input and "
              "rerun the same command (the inputs before it are reused)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
