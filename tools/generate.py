"""Generate text in sequential mode: the model as an RNN, one token and one committed state at a time.

    python tools/generate.py CHECKPOINT_OR_EXPORT --prompt "ROMEO:" [--max-new-tokens 64]
        [--temperature 0.8] [--top-p 0.95] [--top-k 50] [--seed 0] [--verbose]
    python tools/generate.py MODEL --prompt "ROMEO:" --prompt "JULIET:" [--prompts-file FILE]
        [--batch-size 8] [--jsonl]

Between tokens only the committed per-layer state is carried, so memory is constant in the solver
passes. --temperature 0 is greedy. --verbose prints the solver passes and final relative residual
of the step that chose each token. The tokenizer is the run's (data.tokenizer) or the copy in
an exported folder; the solver runs the phase the weights were trained in (see tools/evaluate.py).

Several prompts (--prompt repeated, and one per line of --prompts-file) generate in batches of
--batch-size, left-padded, each row solved on its own: greedy decoding gives each prompt the text
it gets alone. Their texts are printed in order, separated by a line "----", or as JSON lines
({"prompt", "text", "new_tokens", "passes_per_token"}) with --jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a run's checkpoints/ folder or an exported folder")
    p.add_argument("--prompt", action="append", default=None,
                   help="text to continue (empty: start from end-of-document); repeat it for several")
    p.add_argument("--prompts-file", type=Path, default=None, help="more prompts, one per line")
    p.add_argument("--batch-size", type=int, default=8, help="prompts generated together")
    p.add_argument("--jsonl", action="store_true", help="one JSON object per prompt instead of plain text")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eod", action="store_true", help="do not stop at the end-of-document token")
    p.add_argument("--verbose", action="store_true", help="solver passes per token (to stderr)")
    p.add_argument("--phase", default=None)
    p.add_argument("--max-iter", type=int, default=None, help="cap on solver passes per token")
    p.add_argument("--tol", type=float, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="load checkpoint files whose pickles need more than tensors (their code runs)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from implicit_megatron.checkpoints import safe_load
    from implicit_megatron.evaluation.generation import SamplingConfig, continuation_text, generate_batch
    from implicit_megatron.evaluation.loading import NotAModelError, load_model
    from implicit_megatron.evaluation.phases import SolverChoice

    safe_load.set_trust(args.trust_checkpoint)
    for name, value in (("--max-new-tokens", args.max_new_tokens), ("--batch-size", args.batch_size)):
        if value < 1:
            print(f"generate: {name} must be at least 1", file=sys.stderr)
            return 2
    if args.temperature < 0:
        print(f"generate: --temperature must be 0 (greedy) or positive, got {args.temperature}", file=sys.stderr)
        return 2
    try:
        prompts = read_prompts(args)
        loaded = load_model(args.model, device=args.device, choice=SolverChoice(args.phase, args.max_iter, args.tol))
    except (NotAModelError, FileNotFoundError, ValueError) as err:
        print(f"generate: {err}", file=sys.stderr)
        return 2
    tok = loaded.tokenizer
    sampling = SamplingConfig(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed,
                              stop_at_eod=not args.ignore_eod)
    if args.verbose:
        print(f"[generate] {loaded.label}: sequential mode, at most {loaded.solver['cap']} passes per token, "
              f"tolerance {loaded.solver['tol']}", file=sys.stderr)
    for first in range(0, len(prompts), args.batch_size):
        batch = prompts[first:first + args.batch_size]

        def on_token(row: int, token: int, passes: int, residual: float, first=first) -> None:
            if args.verbose:
                which = f"prompt {first + row + 1} " if len(prompts) > 1 else ""
                print(f"[generate] {which}token {token:>6} {tok.decode([token])!r:<16} passes {passes:>3}  "
                      f"residual {residual:.4f}", file=sys.stderr, flush=True)

        encoded = [tok.encode(p) for p in batch]
        results = generate_batch(loaded.model, encoded, sampling, eod_id=tok.eod_id, on_token=on_token)
        for index, (prompt, ids, result) in enumerate(zip(batch, encoded, results, strict=True), start=first):
            new = [t for t in result.new_ids if t != tok.eod_id]
            show(args, index, prompt, continuation_text(tok, ids, new), result)
    return 0


def read_prompts(args) -> list[str]:
    """--prompt's values, then the lines of --prompts-file; one empty prompt when neither is given."""
    prompts = list(args.prompt or [])
    if args.prompts_file is not None:
        try:
            prompts += args.prompts_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"--prompts-file {args.prompts_file}: {err}") from None
    return prompts or [""]


def show(args, index: int, prompt: str, text: str, result) -> None:
    if args.jsonl:
        print(json.dumps({"prompt": prompt, "text": text, "new_tokens": result.new_ids,
                          "passes_per_token": result.passes}), flush=True)
    else:
        print(("----\n" if index else "") + prompt + text, flush=True)
    if args.verbose and result.passes:
        mean = sum(result.passes) / len(result.passes)
        print(f"[generate] {len(result.new_ids)} tokens, {mean:.1f} solver passes per token on average "
              f"(prompt: {sum(result.prompt_passes) / len(result.prompt_passes):.1f})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
