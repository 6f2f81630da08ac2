"""Generation speed: transformers' `generate` with and without the state, or batched serving.

    python tools/bench/bench_generate.py [--config tiny/mamba2-implicit] [--export FOLDER]
        [--prefixes 64,256,1024] [--new-tokens 16] [--repeats 2] [--threads N] [--device cpu|cuda]
    python tools/bench/bench_generate.py --batches 1,8,32 [--models quickstart,EXPORT_FOLDER,...]
        [--prompt-lengths 16,256] [--new-tokens 16] [--starts cold,warm] [--device cpu|cuda]

The second form is the serving table (tools/generate.py's path, `generate_batch`): per model, batch
size and start (cold: each token's solve from zero; warm: from the previous token's fixed point),
greedy, prompts of random lengths in --prompt-lengths, new tokens per second (the prompts' steps
excluded) and mean solver passes per new token and per prompt token. A model is an exported folder
or a config name (random weights; an implicit model's passes then mean little).

With the state (use_cache=True, the default of `generate`) each new token is one sequential-mode
step under the carried state: for Mamba2 its cost does not depend on the prefix. Without it
(use_cache=False) every new token runs the whole prefix again in simultaneous mode. One row per
prefix length: greedy ms per new token, the median time between consecutive tokens handed to a
streamer (the prompt's own step excluded), over --repeats runs, and the backbone passes each new
token took (an implicit solver stops at its tolerance, so passes vary by token). Random weights
from --config unless --export names a folder.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def write_random_export(config: str, out: Path) -> Path:
    from implicit_megatron import build_model, load_config
    from implicit_megatron.hf.export import write_folder

    path = Path(config) if Path(config).is_file() else ROOT / "configs" / f"{config}.yaml"
    cfg = load_config(path, [f"data.tokenizer={ROOT / 'data/tokenizers/gpt-neox-20b.json.xz'}"])
    torch.manual_seed(0)
    return write_folder(out, build_model(cfg).eval(), cfg, torch.float32)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class TokenClock:
    """A streamer that notes when generate hands over each token (the prompt first), and how many
    passes of the backbone (calls of its final norm, in either mode) ran before it."""

    def __init__(self, lm, device: torch.device) -> None:
        self.device, self.times, self.passes, self.count = device, [], [], 0
        self.hook = lm.core.backbone.norm_f.register_forward_hook(self.count_pass)

    def count_pass(self, *_) -> None:
        self.count += 1

    def put(self, value) -> None:
        sync(self.device)
        self.times.append(time.perf_counter())
        self.passes.append(self.count)

    def end(self) -> None:
        self.hook.remove()


def per_new_token(model, prompt: torch.Tensor, new_tokens: int, use_cache: bool, repeats: int) -> tuple[float, float]:
    """Median ms between consecutive new tokens (the prompt's step excluded) over all repeats, and
    the mean backbone passes per new token."""
    intervals, passes = [], []
    for _ in range(repeats):
        clock = TokenClock(model._language_model[0], prompt.device)
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens + 1,
                       min_new_tokens=new_tokens + 1, do_sample=False, use_cache=use_cache, streamer=clock)
        intervals += [(b - a) * 1e3 for a, b in zip(clock.times[1:], clock.times[2:])]  # [0]: the prompt
        passes += [b - a for a, b in zip(clock.passes[1:], clock.passes[2:])]
    return statistics.median(intervals), statistics.mean(passes)


def load_lm(spec: str, device: str):
    """(label, LanguageModel in eval mode) of an exported folder or a config name (random weights)."""
    from implicit_megatron import build_model, load_config
    from implicit_megatron.hf.export import from_pretrained

    if Path(spec).is_dir():
        return "/".join(Path(spec).resolve().parts[-2:]), from_pretrained(spec, device=device)
    path = Path(spec) if Path(spec).is_file() else ROOT / "configs" / f"{spec}.yaml"
    torch.manual_seed(0)
    return spec + " (random)", build_model(load_config(path, check_files=False)).to(device).eval()


def serve(lm, prompts: list[list[int]], new_tokens: int, device: torch.device) -> tuple[float, float, float]:
    """(new tokens per second, passes per new token, passes per prompt token) of one batch."""
    from implicit_megatron.evaluation.generation import SamplingConfig, generate_batch

    marks = []

    def on_token(row: int, *_) -> None:
        if not marks:
            sync(device)
            marks.append(time.perf_counter())

    sampling = SamplingConfig(new_tokens + 1, temperature=0.0, stop_at_eod=False)
    results = generate_batch(lm, prompts, sampling, on_token=on_token)
    sync(device)
    seconds = time.perf_counter() - marks[0]  # from the first new token chosen: the prompts excluded
    passes = [p for r in results for p in r.passes[1:]]  # the steps timed
    prompt_passes = [p for r in results for p in r.prompt_passes]
    return len(prompts) * new_tokens / seconds, statistics.mean(passes), statistics.mean(prompt_passes)


def serving_table(args) -> int:
    device = torch.device(args.device)
    batches = [int(n) for n in args.batches.split(",")]
    shortest, longest = (int(n) for n in args.prompt_lengths.split(","))
    print(f"serving: greedy, {args.new_tokens} new tokens, prompts of {shortest}-{longest} tokens, {args.device}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'model':<32} {'batch':>5} {'start':>5} {'tokens/s':>9} {'x batch 1':>9} {'passes/token':>12} "
          f"{'prompt passes':>13}")
    for spec in args.models.split(","):
        label, lm = load_lm(spec, args.device)
        starts = args.starts.split(",") if lm.core.implicit else ["cold"]
        for start in starts:
            if lm.core.implicit:
                lm.core.set_phase(warm_start=start == "warm")
            base = None
            for batch in batches:
                generator = torch.Generator().manual_seed(batch)
                lengths = torch.randint(shortest, longest + 1, (batch,), generator=generator).tolist()
                prompts = [torch.randint(1, lm.vocab_size, (n,), generator=generator).tolist() for n in lengths]
                speed, passes, prompt_passes = serve(lm, prompts, args.new_tokens, device)
                base = base or speed
                print(f"{label[:32]:<32} {batch:>5} {start:>5} {speed:>9.1f} {speed / base:>8.1f}x {passes:>12.2f} "
                      f"{prompt_passes:>13.2f}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="tiny/mamba2-implicit", help="config name under configs/ or a path")
    p.add_argument("--export", default=None, help="an exported folder instead of random weights")
    p.add_argument("--prefixes", default="64,256,1024", help="comma-separated prompt lengths")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: torch's)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batches", default=None, help="the serving table at these batch sizes, e.g. 1,8,32")
    p.add_argument("--models", default="quickstart", help="serving table: exported folders or config names")
    p.add_argument("--prompt-lengths", default="16,256", help="serving table: shortest,longest prompt")
    p.add_argument("--starts", default="cold,warm", help="serving table: cold, warm or both")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.batches:
        return serving_table(args)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.export) if args.export else write_random_export(args.config, Path(tmp) / "export")
        model = AutoModelForCausalLM.from_pretrained(folder).to(args.device).eval()
    lm = model._language_model[0]
    label = args.export or args.config
    kind = "implicit" if lm.core.implicit else "explicit"
    print(f"{label}: {lm.config.arch} {kind}, d_model {lm.config.d_model}, {lm.config.n_layers} layers, "
          f"{args.device}, {torch.get_num_threads()} threads, greedy, {args.new_tokens} new tokens")
    print(f"{'prefix':>8} {'with state ms/token':>20} {'passes':>7} {'whole prefix ms/token':>22} {'passes':>7} "
          f"{'ratio':>7}")
    generator = torch.Generator().manual_seed(0)
    for length in [int(n) for n in args.prefixes.split(",")]:
        prompt = torch.randint(1, lm.vocab_size, (1, length), generator=generator).to(args.device)
        cached, cached_passes = per_new_token(model, prompt, args.new_tokens, True, args.repeats)
        whole, whole_passes = per_new_token(model, prompt, args.new_tokens, False, args.repeats)
        print(f"{length:>8} {cached:>20.2f} {cached_passes:>7.1f} {whole:>22.2f} {whole_passes:>7.1f} "
              f"{whole / cached:>6.1f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
