"""Our model in lm-evaluation-harness: `lm_eval --model implicit_megatron --model_args pretrained=PATH`.

Scoring (loglikelihood, loglikelihood_rolling) runs batched in simultaneous mode by default
(`mode=sequential` scores token by token instead); generation (generate_until) always runs in
sequential mode, as the model is deployed, batch_size requests at a time (those with the same
generation settings, left-padded, each row solved on its own). Padding is masked in both modes: it
enters no row's state and no stop test. Log-probabilities are over the real vocabulary: the padded
logits are masked. Importing this module registers the model.
"""

from __future__ import annotations

import sys
from typing import cast

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from implicit_megatron.evaluation.generation import SamplingConfig, generate_batch
from implicit_megatron.evaluation.loading import LoadedModel, load_model
from implicit_megatron.evaluation.phases import SolverChoice

DEFAULT_BATCH_SIZE = 8
DEFAULT_MAX_GEN_TOKS = 256


def _optional(value, kind):
    return None if value in (None, "", "None", "none") else kind(value)


def available_device(device: str | None) -> str:
    """The device asked for, or the CPU where a GPU is asked for and none exists, with one line saying
    so: lm-eval's command line asks for cuda:0 unless told, and its `hf` model falls back the same way."""
    if device is None or device == "":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"implicit_megatron: no GPU here, so the model runs on the CPU (device {device} was asked for; "
              "pass --device cpu to say so)", file=sys.stderr, flush=True)
        return "cpu"
    return device


@register_model("implicit_megatron")
class ImplicitMegatronLM(TemplateLM):
    """`pretrained` is a checkpoint folder or an export; `loaded` passes a model already in memory."""

    def __init__(self, pretrained: str | None = None, loaded: LoadedModel | None = None, device: str | None = None,
                 batch_size: int | str | None = DEFAULT_BATCH_SIZE, max_length: int | None = None,
                 mode: str = "simultaneous", phase: str | None = None, max_iter: int | None = None,
                 tol: float | None = None, eval_stop: str = "token", **_ignored) -> None:
        super().__init__()
        if loaded is None:
            if pretrained is None:
                raise ValueError("implicit_megatron needs pretrained=PATH (a checkpoint folder or an export)")
            choice = SolverChoice(_optional(phase, str), _optional(max_iter, int), _optional(tol, float),
                                  eval_stop=eval_stop)
            loaded = load_model(pretrained, device=available_device(device), choice=choice)
        if mode not in ("simultaneous", "sequential"):
            raise ValueError(f"mode must be simultaneous or sequential, not {mode!r}")
        self.loaded, self.model, self.tok = loaded, loaded.model, loaded.tokenizer
        self.mode = mode
        self.batch_size = int(cast("int | str", batch_size)) if str(batch_size).isdigit() else DEFAULT_BATCH_SIZE
        self.max_length = int(max_length or loaded.cfg.data.seq_len)
        self._device = self.model.embedding.weight.device

    # ---------------------------------------------------------------- tokenizer

    @property
    def eot_token_id(self) -> int:
        return self.tok.eod_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tok.encode(string)

    def tok_decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)

    # ---------------------------------------------------------------- scoring

    @torch.no_grad()
    def _logprobs(self, inputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T) ids, padded where mask is 0 -> (B, T, vocab) log-probabilities over the real vocabulary."""
        if self.mode == "sequential":
            z, _, _ = self.model.core.forward_sequential(self.model.embedding(inputs), mask=mask)
            logits = self.model.logits(z)
        else:
            logits = self.model(inputs, attention_mask=mask)
        return torch.log_softmax(logits[..., :self.model.vocab_size].float(), dim=-1)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """Each request is (key, context ids, continuation ids); batched longest first, right-padded."""
        prepared = []
        for index, (key, context, continuation) in enumerate(requests):
            whole = (list(context) + list(continuation))[-(self.max_length + 1):]
            scored = min(len(continuation), len(whole) - 1)  # a long continuation loses its first tokens
            prepared.append((index, key, whole[:-1], list(continuation)[len(continuation) - scored:]))
        prepared.sort(key=lambda item: -len(item[2]))
        results: list[tuple[float, bool] | None] = [None] * len(prepared)
        for start in range(0, len(prepared), self.batch_size):
            chunk = prepared[start:start + self.batch_size]
            width = max(len(item[2]) for item in chunk)
            ids = torch.full((len(chunk), width), self.eot_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.bool)
            for row, item in enumerate(chunk):
                ids[row, :len(item[2])] = torch.tensor(item[2])
                mask[row, :len(item[2])] = True
            logprobs = self._logprobs(ids.to(self._device), mask.to(self._device)).cpu()
            for row, (index, key, inputs, continuation) in enumerate(chunk):
                n = len(continuation)
                if n == 0:
                    results[index] = (0.0, True)
                    continue
                picked = logprobs[row, len(inputs) - n:len(inputs)]
                target = torch.tensor(continuation)
                answer = (picked.gather(-1, target[:, None]).sum().item(), bool((picked.argmax(-1) == target).all()))
                results[index] = answer
                if key is not None:
                    self.cache_hook.add_partial("loglikelihood", key, answer)
        return cast("list[tuple[float, bool]]", results)  # every request answered

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each document's whole log-likelihood in disjoint windows of max_length, conditioned on EOD."""
        out = []
        for request in requests:
            (text,) = request.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                self.tok_encode(text), self.prefix_token_id, self.max_length, 1)]
            scores = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows])
            total = sum(score for score, _ in scores)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    # ---------------------------------------------------------------- generation

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Sequential-mode generation until a stop string, EOD or max_gen_toks: requests with the same
        generation settings together, batch_size at a time, longest prompt first."""
        groups: dict[tuple, list[tuple[int, list[int]]]] = {}
        for index, request in enumerate(requests):
            settings = self._generation_settings(request.args[1])
            prompt = self.tok_encode(request.args[0])[-max(1, self.max_length - settings[1]):]
            groups.setdefault(settings, []).append((index, prompt))
        out: list[str | None] = [None] * len(requests)
        for (until, max_new, temperature, top_k, top_p), items in groups.items():
            items.sort(key=lambda item: -len(item[1]))
            sampling = SamplingConfig(max_new, temperature, top_k, top_p, seed=1234)

            def stop(row: int, new_ids: list[int], until=until) -> bool:
                return any(u in self.tok_decode(new_ids) for u in until)

            for start in range(0, len(items), self.batch_size):
                chunk = items[start:start + self.batch_size]
                results = generate_batch(self.model, [prompt for _, prompt in chunk], sampling,
                                         eod_id=self.eot_token_id, stop=stop)
                for (index, _), result in zip(chunk, results, strict=True):
                    text = self.tok_decode([t for t in result.new_ids if t != self.eot_token_id])
                    for u in until:
                        text = text.split(u)[0]
                    self.cache_hook.add_partial("generate_until", requests[index].args, text)
                    out[index] = text
        return cast("list[str]", out)  # every request answered

    def _generation_settings(self, gen_kwargs: dict | None) -> tuple:
        """(stop strings, max new tokens, temperature, top_k, top_p) of a request: greedy unless do_sample."""
        gen_kwargs = dict(gen_kwargs or {})
        # a sentencepiece end token decodes to "": generation stops at its id, and "" is no stop string
        eos = self.tok_decode([self.eot_token_id]) or None
        until = handle_stop_sequences(gen_kwargs.pop("until", None), eos=eos)
        max_new = int(gen_kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
        sampled = bool(gen_kwargs.get("do_sample", False))
        temperature = float(gen_kwargs.get("temperature", 1.0)) if sampled else 0.0
        return (tuple(until), max_new, temperature, _optional(gen_kwargs.get("top_k"), int),
                _optional(gen_kwargs.get("top_p"), float))
