"""An export stands alone: in a Python where this package cannot be imported, transformers' Auto
classes load it (`trust_remote_code=True` runs the folder's own copy of the package's modules,
hf/remote_code.py) and give what the package gives: both backbones, implicit and explicit, the
per-position and the released stop rules, sequential-mode generation of a padded batch. Its tokenizer
loads without running any code of the folder, and `save_pretrained` writes a folder that loads again."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.tiny_exports import NO_PACKAGE
from transformers import AutoModelForCausalLM, AutoTokenizer

from implicit_megatron.hf.remote_code import MODELING_FILE, bundle

PROMPTS = ["ROMEO: but soft", "A"]
NEW_TOKENS = 4
CASES = [("mamba2-implicit", "token"), ("mamba2-implicit", "batch"), ("llama-implicit", "token"),
         ("llama-implicit", "batch"), ("mamba2-explicit", "token"), ("llama-explicit", "token")]

WITHOUT_THE_PACKAGE = NO_PACKAGE + """import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

cases, prompts, new_tokens, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ran = lambda: sorted(m for m in sys.modules if m.startswith("transformers_modules."))
tokenizers = {}
for folder, _, _ in cases:  # stdin is closed: transformers' question about config.json's code is answered no
    for flag in ({}, {"trust_remote_code": False}):
        tokenizers[folder] = AutoTokenizer.from_pretrained(folder, **flag)
assert not ran(), f"a tokenizer ran the folder's code: {ran()}"
got = {}
for folder, eval_stop, save in cases:
    tokenizer = tokenizers[folder]
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, eval_stop=eval_stop).eval()
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    sequences = model.generate(**batch, max_new_tokens=new_tokens, do_sample=False).tolist()
    got[f"{folder} {eval_stop}"] = {"logits": logits, "sequences": sequences}
    if save:
        model.save_pretrained(save)
        again = AutoModelForCausalLM.from_pretrained(save, trust_remote_code=True, eval_stop=eval_stop).eval()
        with torch.no_grad():
            assert torch.equal(again(**batch).logits, logits), "the saved folder computes something else"
torch.save(got, out)
print("loaded alone")
"""


@pytest.mark.processes
def test_an_export_loads_and_generates_in_a_python_without_the_package(exports, tmp_path):
    saved = tmp_path / "saved"
    cases = [(str(exports[name]), stop, str(saved) if (name, stop) == ("llama-implicit", "token") else None)
             for name, stop in CASES]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run([sys.executable, "-c", WITHOUT_THE_PACKAGE, json.dumps(cases), json.dumps(PROMPTS),
                             str(NEW_TOKENS), str(tmp_path / "got.pt")], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "loaded alone" in result.stdout, result.stderr[-3000:]
    got = torch.load(tmp_path / "got.pt")
    for name, stop in CASES:
        tokenizer = AutoTokenizer.from_pretrained(exports[name])
        model = AutoModelForCausalLM.from_pretrained(exports[name], eval_stop=stop).eval()  # the package's classes
        assert type(model).__module__ == "implicit_megatron.hf.model"
        batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
        assert batch["attention_mask"].min() == 0  # a padded batch
        with torch.no_grad():
            expected = model(**batch).logits
        alone = got[f"{exports[name]} {stop}"]
        torch.testing.assert_close(alone["logits"], expected, rtol=1e-5, atol=1e-5, msg=f"{name} {stop}")
        assert alone["sequences"] == model.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=False).tolist()
    assert {p.name for p in saved.glob("*.py")} == {p.name for p in exports["llama-implicit"].glob("*.py")}


TOKENIZER_ALONE = NO_PACKAGE + """from transformers import PreTrainedTokenizerFast
tokenizer = PreTrainedTokenizerFast.from_pretrained(sys.argv[1])
print(tokenizer.padding_side, repr(tokenizer.decode(tokenizer("ROMEO: but soft")["input_ids"])))
"""


@pytest.mark.processes
def test_the_documented_tokenizer_load_without_the_package_says_nothing(exports):
    """AutoTokenizer reads config.json first: told not to run its code, transformers warns that the model
    type "can yield errors". The class tokenizer_config.json names reads the tokenizer's files alone."""
    docs = (Path(__file__).resolve().parents[3] / "docs/checkpoints.md").read_text()
    assert 'tokenizer = PreTrainedTokenizerFast.from_pretrained("runs/quickstart/export")' in docs
    result = subprocess.run([sys.executable, "-c", TOKENIZER_ALONE, str(exports["llama-implicit"])],
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]
    assert result.stdout == "left 'ROMEO: but soft'\n"


def test_the_folder_carries_the_package_modules_the_model_needs_and_no_other(exports):
    folder = exports["mamba2-implicit"]
    files = {p.name: p.read_text() for p in folder.glob("*.py")}
    assert files == bundle(Path(sys.modules["implicit_megatron"].__file__).parent)
    needed = {"im_hf_model.py", "im_hf_config.py", "im_models_mamba2_mixer.py", "im_models_llama_layer.py",
              "im_implicit_core.py", "im_implicit_solver.py", "im_implicit_iteration.py",
              "im_implicit_sequential.py", "im_hf_generation_state.py"}
    assert needed <= set(files)
    for name in ("im_hf_export.py", "im_checkpoints_layout.py", "im_utils_lean_imports.py", "im_prelaunch.py"):
        assert name not in files  # checkpoint readers, DeepSpeed and megatron-core stay out
    for name, text in files.items():
        imported = [n.module if isinstance(n, ast.ImportFrom) else n.names[0].name for n in ast.walk(ast.parse(text))
                    if isinstance(n, ast.Import | ast.ImportFrom)]
        assert not [m for m in imported if (m or "").startswith("implicit_megatron")], name
        assert name == MODELING_FILE or f"from .{name[:-3]} import" in files[MODELING_FILE]  # what transformers copies


def write_package(root: Path, model_source: str) -> Path:
    package = root / "implicit_megatron"
    for module, text in {"__init__": "", "hf/__init__": "", "hf/config": "X = 1\n", "hf/model": model_source,
                         "models/__init__": "", "models/kernels": "K = 1\n", "models/norms": "N = 1\n"}.items():
        (package / f"{module}.py").parent.mkdir(parents=True, exist_ok=True)
        (package / f"{module}.py").write_text(text)
    return package


@pytest.mark.parametrize("line, error", [
    ("from implicit_megatron.models import kernels, K\n", "hf/model.py:2: imports modules and names in one statement"),
    ("from implicit_megatron import models\n", "hf/model.py:2: imports from the package's root"),
    ("import implicit_megatron.models.kernels\n", "hf/model.py:2: `import implicit_megatron...`"),
    ("from .config import X\n", "hf/model.py:2: a relative import"),
])
def test_an_import_the_copy_cannot_rewrite_is_refused_naming_the_line(tmp_path, line, error):
    import re

    package = write_package(tmp_path, "import os\n" + line)
    with pytest.raises(ValueError, match=re.escape(error)):
        bundle(package)


def test_module_imports_become_relative_and_keep_their_names(tmp_path):
    source = ("from implicit_megatron.hf.config import (\n    X,\n)\n\n\ndef f():\n"
              "    from implicit_megatron.models import (\n        kernels as k,\n        norms,\n    )\n"
              "    return k.K + norms.N + X\n")
    files = bundle(write_package(tmp_path, source))
    assert files["im_hf_model.py"].split("\n", 1)[1] == (
        "from .im_hf_config import (\n    X,\n)\n\n\ndef f():\n"
        "    from . import im_models_kernels as k, im_models_norms as norms\n    return k.K + norms.N + X\n")
    for name in ("im_models_kernels", "im_models_norms", "im_hf_config"):
        assert f"from .{name} import __name__ as _" in files[MODELING_FILE]
