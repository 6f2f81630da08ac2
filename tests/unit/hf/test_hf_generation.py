"""transformers' `generate` on exported folders: tokenizer output in, the sequential-mode state carried.

Which equalities are exact and which hold within a tolerance:
- `generate` with the state (use_cache=True, the default) runs exactly the computation of
  tools/generate.py (`evaluation.generation.generate`): the prompt token by token, then each new
  token as one solved step under the committed state. Same tokens, exactly (each row of a batch
  stops on its own residual; padded batches: test_hf_padded_batches.py).
- `generate(use_cache=False)` runs the whole prefix in simultaneous mode for every new token. For
  the explicit models that is the same function up to rounding (logits within 1e-5, relative). For
  the implicit ones both modes solve the same fixed-point equations, per token or for the whole
  sequence at once, so they agree as far as both solves converged: the tiny implicit models here
  are contractive (see write_tiny_export) and solved to 1e-5, so their logits agree within 1e-4,
  ten times less than the gap between the two best tokens, and the tokens are equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from support.processes import ROOT
from support.tiny_exports import MODELS
from transformers import AutoModelForCausalLM, AutoTokenizer

from implicit_megatron.evaluation.generation import SamplingConfig, generate
from implicit_megatron.evaluation.loading import load_model
from implicit_megatron.hf.generation_state import SequentialState
from implicit_megatron.hf.model import STATE_FIELD

PROMPTS = ["ROMEO: what", "HAMLET: to"]  # six tokens each: a batch without padding
NEW_TOKENS = 8
# generate's argument and outputs name the state `cache` from transformers 5.24 on, `past_key_values` before
CACHE = STATE_FIELD


def state_of(output) -> SequentialState | None:
    return output.get(CACHE)


def load(folder: Path):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer, AutoModelForCausalLM.from_pretrained(folder).eval()


@pytest.mark.parametrize("name", MODELS)
def test_generate_carries_the_state_and_gives_the_tokens_of_the_whole_prefix(name, exports):
    tokenizer, hf = load(exports[name])
    batch = tokenizer(PROMPTS, return_tensors="pt")
    assert batch["attention_mask"].shape == (2, 6)
    seen = []
    hf.embedding.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    greedy = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "return_dict_in_generate": True,
              "output_logits": True}
    cached = hf.generate(**batch, **greedy)
    assert seen == [6] + [1] * (NEW_TOKENS - 1)  # the prompt once, then only each new token
    assert isinstance(state_of(cached), SequentialState)
    seen.clear()
    whole = hf.generate(**batch, **greedy, use_cache=False)
    assert seen == list(range(6, 6 + NEW_TOKENS))  # the whole prefix again for every token

    assert cached.sequences.tolist() == whole.sequences.tolist()
    cached_logits, whole_logits = torch.stack(cached.logits), torch.stack(whole.logits)
    difference = (cached_logits - whole_logits).abs().max().item()
    assert difference < (1e-4 if "implicit" in name else 1e-5) * whole_logits.abs().max().item()
    best_two = whole_logits.topk(2, dim=-1).values
    assert (best_two[..., 0] - best_two[..., 1]).min().item() > 10 * difference  # equal tokens by a margin

    # tools/generate.py: the tool's loader and sequential-mode generation, one prompt at a time
    loaded = load_model(exports[name])
    for row, prompt in enumerate(PROMPTS):
        ours = generate(loaded.model, loaded.tokenizer.encode(prompt),
                        SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=0.0), eod_id=loaded.tokenizer.eod_id)
        one = hf.generate(**tokenizer(prompt, return_tensors="pt"), max_new_tokens=NEW_TOKENS, do_sample=False)
        assert one[0, 6:].tolist() == ours.new_ids
        assert cached.sequences[row].tolist() == one[0].tolist()  # each row stops on its own


def test_beam_search_reorders_the_state(exports):
    tokenizer, hf = load(exports["mamba2-explicit"])
    batch = tokenizer(PROMPTS, return_tensors="pt")
    beams = {"max_new_tokens": 4, "do_sample": False, "num_beams": 3}
    assert hf.generate(**batch, **beams).tolist() == hf.generate(**batch, **beams, use_cache=False).tolist()


def test_llama_kv_cache_grows_past_the_prompt(exports):
    """The prompt's state has room for the prompt only; new tokens copy it into larger buffers."""
    _, hf = load(exports["llama-explicit"])
    ids = torch.tensor([[5, 6, 7]])
    out = hf(ids, use_cache=True)
    state = state_of(out)
    assert state.get_seq_length() == 3 and state.state[0].k.shape[2] == 3
    logits = [hf(torch.tensor([[t]]), past_key_values=state).logits[:, -1] for t in (8, 9, 10, 11)]
    assert state.get_seq_length() == 7 and state.state[0].k.shape[2] >= 7
    whole = hf(torch.tensor([[5, 6, 7, 8, 9, 10, 11]])).logits[:, 3:]
    assert torch.allclose(torch.stack(logits, dim=1), whole, atol=1e-5)


def test_generate_continues_from_a_returned_state(exports):
    _, hf = load(exports["llama-explicit"])
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    whole = hf.generate(ids, max_new_tokens=8, do_sample=False)
    first = hf.generate(ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert state_of(first).get_seq_length() == 7  # the last new token is not run yet
    rest = hf.generate(first.sequences, **{CACHE: state_of(first)}, max_new_tokens=5, do_sample=False)
    assert rest.tolist() == whole.tolist()


def test_a_mask_of_ones_changes_nothing(exports):
    tokenizer, hf = load(exports["mamba2-explicit"])
    batch = tokenizer(PROMPTS[0], return_tensors="pt")
    plain = hf.generate(batch["input_ids"], max_new_tokens=3, do_sample=False)
    assert plain.tolist() == hf.generate(**batch, max_new_tokens=3, do_sample=False).tolist()


def test_the_export_tells_generate_its_end_of_document_and_padding_rows(exports):
    """AutoTokenizer needs nothing but the folder (the package registers the config); generate stops at the
    end-of-document token and never picks a padding row of the vocabulary, as tools/generate.py."""
    from data_pipeline.tokenizer import load_tokenizer

    tokenizer, hf = load(exports["mamba2-explicit"])
    ours = load_tokenizer(ROOT / "data/tokenizers/shakespeare-bpe-1000.json.xz")
    text = "ROMEO: But, soft! what light through yonder window breaks?"
    assert tokenizer(text)["input_ids"] == ours.encode(text)
    assert tokenizer.eos_token_id == ours.eod_id == hf.generation_config.eos_token_id
    assert hf.generation_config.pad_token_id == ours.eod_id
    vocab = hf.config.implicit_megatron["model"]["vocab_size"]  # the real rows; config.vocab_size counts padding
    assert hf.config.vocab_size == hf.embedding.weight.shape[0] > vocab
    assert hf.generation_config.suppress_tokens == list(range(vocab, hf.embedding.weight.shape[0]))
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    out = hf.generate(ids, max_new_tokens=1, do_sample=False, return_dict_in_generate=True, output_logits=True)
    first = out.sequences[0, -1].item()
    assert out.logits[0][0, first] > 0
    with torch.no_grad():  # padding rows ten times the best row: their logits would win
        hf.embedding.weight[vocab:] = hf.embedding.weight[first] * 10
    assert hf.generate(ids, max_new_tokens=1, do_sample=False)[0, -1].item() == first


@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5,
                    reason="transformers 4 cannot convert a sentencepiece model: its exports keep tokenizer.model only")
@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_a_sentencepiece_export_tokenizes_as_the_run_did(exports, tmp_path, model_type):
    """The export carries tokenizer.json, transformers' conversion of the model, checked at export to
    give its ids: transformers 4.x loads that file (through the tokenizers library, read here
    directly) where it has no class for a plain sentencepiece model."""
    import shutil

    from data_pipeline.tokenizer import load_tokenizer
    from data_pipeline.train_tokenizer import train_sentencepiece
    from implicit_megatron.hf.export import CONFIG_FILE, write_tokenizer

    texts = [f"ROMEO: line {i}, but soft what light through yonder window breaks" for i in range(200)]
    model = train_sentencepiece(iter(texts), 400, str(tmp_path / "sp.model"), model_type)
    folder = tmp_path / "export"
    folder.mkdir()
    for path in exports["llama-explicit"].iterdir():
        if path.name == CONFIG_FILE or path.suffix == ".py":
            shutil.copy(path, folder / path.name)
    eod = write_tokenizer(Path(model), folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ours = load_tokenizer(model)
    text = "ROMEO: but soft, what light through yonder window"
    assert tokenizer(text)["input_ids"] == ours.encode(text)
    assert eod == ours.eod_id == tokenizer.eos_token_id
    import json

    from tokenizers import Tokenizer

    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    for line in (text, " leading", "tabs\tand\nlines 42"):
        assert Tokenizer.from_file(str(folder / "tokenizer.json")).encode(line).ids == ours.encode(line)


OLD_COPY = """
import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
assert not type(model).__module__.startswith("implicit_megatron"), type(model).__module__  # the folder's copy
import implicit_megatron
ids = torch.tensor([[5, 17, 300, 2, 9]])
with torch.no_grad():
    assert torch.equal(model(ids).logits, implicit_megatron.from_pretrained(sys.argv[1])(ids))
try:
    model(ids[:, :3], attention_mask=torch.tensor([[0, 1, 1]]))
    raise SystemExit("the copy took padding")
except ValueError as err:  # what that copy refused, it still refuses
    assert "padding" in str(err), err
print("the old copy ran")
"""


@pytest.mark.processes
@pytest.mark.parametrize("name", ["mamba2-implicit", "llama-explicit"])
def test_a_folder_exported_by_an_earlier_version_loads_and_generates_the_same(name, exports, tmp_path):
    """Until the package had rooms, exports carried a whole copy of the wrapper, which imports modules
    that have since moved. With the package imported, such a folder loads the installed classes (its
    copy never runs) and gives the tokens and logits of one exported now. Where transformers runs the
    copy (trust_remote_code without the package imported), hf/legacy_names.py answers its old imports."""
    import shutil
    import subprocess
    import sys

    from implicit_megatron.hf.remote_code import MODELING_FILE

    old = shutil.copytree(exports[name], tmp_path / "old")
    shutil.copy(ROOT / "tests/fixtures/old_export" / MODELING_FILE, old / MODELING_FILE)
    assert "from implicit_megatron.hf_cache import" in (old / MODELING_FILE).read_text()
    assert "from implicit_megatron" not in (exports[name] / MODELING_FILE).read_text()
    tokenizer, now = load(exports[name])
    _, before = load(old)
    assert type(before) is type(now)  # the installed class, not the folder's copy
    batch = tokenizer(PROMPTS, return_tensors="pt")
    greedy = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "return_dict_in_generate": True,
              "output_logits": True}
    expected, got = now.generate(**batch, **greedy), before.generate(**batch, **greedy)
    assert got.sequences.tolist() == expected.sequences.tolist()
    assert torch.equal(torch.stack(got.logits), torch.stack(expected.logits))
    if name == "mamba2-implicit":
        copy = subprocess.run([sys.executable, "-c", OLD_COPY, str(old)], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert copy.returncode == 0 and "the old copy ran" in copy.stdout, copy.stderr[-3000:]


def test_save_pretrained_writes_what_an_export_carries(exports, tmp_path):
    """A model loaded through the Auto classes saves the code exports carry (not the package's module
    alone, which imports the package), and the folder loads in transformers and in implicit_megatron alike."""
    from implicit_megatron import from_pretrained
    from implicit_megatron.hf.export import CONFIG_FILE
    from implicit_megatron.hf.remote_code import AUTO_MAP

    _, hf = load(exports["mamba2-implicit"])
    hf.save_pretrained(tmp_path / "saved")
    saved = tmp_path / "saved"
    code = {p.name: p.read_text() for p in exports["mamba2-implicit"].glob("*.py")}
    assert {p.name: p.read_text() for p in saved.glob("*.py")} == code
    assert json.loads((saved / CONFIG_FILE).read_text())["auto_map"] == AUTO_MAP
    assert "_auto_class" not in type(hf).__dict__  # left as loading left it (the registered class: unset)
    ids = torch.tensor([[5, 9, 2, 7]])
    again = AutoModelForCausalLM.from_pretrained(saved).eval()
    assert torch.equal(again(ids).logits, hf(ids).logits)
    assert torch.equal(from_pretrained(saved).eval()(ids), hf(ids).logits)
