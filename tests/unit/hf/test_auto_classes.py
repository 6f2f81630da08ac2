"""An export you received loads through transformers' Auto classes without running its code: once
the package is imported, whichever comes first, `model_type: implicit_megatron` names the installed
classes, so a line added to the folder's modeling file never runs (with or without
trust_remote_code), and the model computes what `implicit_megatron.from_pretrained` computes."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from support.processes import ROOT

LOAD = """
import sys, torch
folder, marker = sys.argv[1], sys.argv[2]
if {transformers_first}:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    try:
        AutoModelForCausalLM.from_pretrained(folder)
        raise SystemExit("loaded without the package: expected transformers to ask for trust_remote_code")
    except ValueError as err:
        assert "trust_remote_code" in str(err), err
import implicit_megatron
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
ids = torch.tensor([[5, 17, 300, 2, 9]])
expected = implicit_megatron.from_pretrained(folder)(ids)
for flag in ({{}}, {{"trust_remote_code": True}}):
    config = AutoConfig.from_pretrained(folder, **flag)
    model = AutoModelForCausalLM.from_pretrained(folder, **flag).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, **flag)
    assert type(model).__module__ == "implicit_megatron.hf.model", type(model).__module__
    assert type(config).__module__ == "implicit_megatron.hf.config", type(config).__module__
    with torch.no_grad():
        assert torch.equal(model(ids).logits, expected)
    assert tokenizer("ROMEO:")["input_ids"]
print("loaded")
"""


@pytest.mark.processes
@pytest.mark.parametrize("transformers_first", [False, True])
def test_a_tampered_export_loads_the_installed_model_and_runs_nothing(transformers_first, exports, tmp_path):
    folder = shutil.copytree(exports["mamba2-implicit"], tmp_path / "received")
    marker = tmp_path / "marker"
    with open(folder / "modeling_implicit_megatron.py", "a") as f:
        f.write(f"\nopen({str(marker)!r}, 'w').write('the folder ran code')\n")
    result = subprocess.run([sys.executable, "-c", LOAD.format(transformers_first=transformers_first), str(folder),
                             str(marker)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("loaded"), result.stderr[-3000:]
    assert not marker.exists()


def test_the_tools_and_the_readme_never_pass_trust_remote_code():
    """What we tell users and what our tools do load exports the safe way; the one place that shows the
    flag, for an export loaded where the package is not installed, says never to pass it for a folder
    you received."""
    files = [ROOT / "README.md", *(ROOT / "tools").rglob("*.py"), *(ROOT / "implicit_megatron").rglob("*.py"),
             *(ROOT / "docs").rglob("*.md")]
    passing = [str(f.relative_to(ROOT)) for f in files if "trust_remote_code=True)" in f.read_text()
               or "trust_remote_code=True," in f.read_text()]
    assert passing == ["docs/checkpoints.md"], passing
    section = (ROOT / "docs/checkpoints.md").read_text().split("### An export without the package")[1].split("\n#")[0]
    assert "trust_remote_code=True)" in section and "never pass it for a folder you received" in section
