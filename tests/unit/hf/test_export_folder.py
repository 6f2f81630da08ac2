"""An export appears under its name only when whole: a kill half-way leaves no folder that loads with
files missing; exporting again over an earlier export keeps what else that folder held."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.processes import ROOT, on_a_small_tmpfs

from implicit_megatron import build_model, from_pretrained, load_config
from implicit_megatron.hf.export import CONFIG_FILE, MODEL_FILE, write_folder
from implicit_megatron.hf.remote_code import MODELING_FILE

KILLED_WHILE_WRITING = """
import os, sys, torch
from implicit_megatron import build_model, load_config
from implicit_megatron.hf import export

def killed(out):  # the code is written last: die as kill -9 would, just before it
    os._exit(137)

export.write_remote_code = killed
cfg = load_config("configs/tiny/mamba2-explicit.yaml", check_files=False)
export.write_folder(export.Path(sys.argv[1]), build_model(cfg), cfg, torch.float32)
"""


KILLED_WHILE_REPLACING = """
import os, sys, torch
from implicit_megatron import build_model, load_config
from implicit_megatron.hf import export

real, renames = os.replace, []

def dying(src, dst):  # die as kill -9 would, just before the n-th rename of the export's folders
    if ".export." in f"{src}{dst}":
        renames.append(dst)
        if len(renames) == int(sys.argv[2]):
            os._exit(137)
    real(src, dst)

os.replace = dying
cfg = load_config("configs/tiny/mamba2-explicit.yaml", check_files=False)
export.write_folder(export.Path(sys.argv[1]), build_model(cfg), cfg, torch.float32)
"""


def tiny():
    cfg = load_config(ROOT / "configs/tiny/mamba2-explicit.yaml",
                      [f"data.tokenizer={ROOT / 'data/tokenizers/shakespeare-bpe-1000.json.xz'}"])
    return build_model(cfg).eval(), cfg


@pytest.mark.processes
def test_a_killed_export_leaves_no_folder_under_its_name(tmp_path):
    out = tmp_path / "export"
    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_WRITING, str(out)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == 137, killed.stderr[-2000:]
    assert not out.exists()
    (partial,) = tmp_path.glob(".export.partial-*")  # what the kill left, hidden
    assert (partial / MODEL_FILE).is_file() and not (partial / MODELING_FILE).exists()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_pretrained(out)
    model, cfg = tiny()
    write_folder(out, model, cfg, torch.float32)
    assert not list(tmp_path.glob(".export.*"))  # the next export cleared it
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    assert torch.equal(from_pretrained(out)(ids), model(ids))


def test_exporting_again_replaces_the_export_and_keeps_the_rest(tmp_path):
    out = tmp_path / "export"
    model, cfg = tiny()
    write_folder(out, model, cfg, torch.float32)
    (out / "evaluation").mkdir()
    (out / "evaluation" / "results.json").write_text("{}")
    with torch.no_grad():
        model.embedding.weight.mul_(2)
    write_folder(out, model, cfg, torch.float32)
    assert (out / "evaluation" / "results.json").read_text() == "{}"
    assert {p.name for p in out.iterdir()} >= {CONFIG_FILE, MODEL_FILE, MODELING_FILE, "evaluation"}
    assert torch.equal(from_pretrained(out).embedding.weight, model.embedding.weight)
    assert not list(tmp_path.glob(".export.*"))
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ValueError, match=r"a-file: exists and is not a folder"):
        write_folder(Path(tmp_path / "a-file"), model, cfg, torch.float32)


@pytest.mark.processes
@pytest.mark.parametrize("renames_done", [0, 1])
def test_a_re_export_killed_while_replacing_keeps_a_whole_export_and_its_evaluation(renames_done, tmp_path):
    """Killed before the swap's first rename (the old export in place) or between its two (the old one
    under a hidden name, its name empty): the next export restores and replaces it, evaluation kept."""
    out = tmp_path / "export"
    model, cfg = tiny()
    write_folder(out, model, cfg, torch.float32)
    (out / "evaluation").mkdir()
    (out / "evaluation" / "results.json").write_text("{}")
    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_REPLACING, str(out), str(renames_done + 1)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert killed.returncode == 137, killed.stderr[-2000:]
    if renames_done == 0:
        assert (out / "evaluation" / "results.json").is_file() and from_pretrained(out) is not None
    else:
        assert not out.exists() and len(list(tmp_path.glob(".export.replaced-*"))) == 1
    with torch.no_grad():
        model.embedding.weight.mul_(2)
    write_folder(out, model, cfg, torch.float32)
    assert (out / "evaluation" / "results.json").read_text() == "{}"
    assert torch.equal(from_pretrained(out).embedding.weight, model.embedding.weight)
    assert not list(tmp_path.glob(".export.*"))


WRITTEN_UNDER_A_LIMIT = """
import resource, sys, torch
from implicit_megatron import build_model, load_config
from implicit_megatron.hf import export

cfg = load_config("configs/tiny/mamba2-explicit.yaml", check_files=False)
model = build_model(cfg)
export.write_folder(export.Path(sys.argv[1]), model, cfg, torch.float32)  # the export there before
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 18, 1 << 18))  # as `ulimit -f 256`, below the weights (0.5 MB)
try:
    export.write_folder(export.Path(sys.argv[1]), model, cfg, torch.float32)
except OSError as err:
    print(err)
"""


@pytest.mark.processes
def test_an_export_that_meets_a_file_size_limit_is_named_and_leaves_the_old_one(tmp_path):
    out = tmp_path / "export"
    result = subprocess.run([sys.executable, "-c", WRITTEN_UNDER_A_LIMIT, str(out)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == (f"{out}: not written: the file size limit of this process was reached (ulimit "
                                     "-f: 262144 bytes); the folder there before is left as it was"), result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no partial folder left
    assert load_file(out / MODEL_FILE)  # the old export, whole


WRITTEN_ON_A_FULL_DISK = """
import torch
from pathlib import Path
from safetensors.torch import load_file
from implicit_megatron import build_model, load_config
from implicit_megatron.hf import export

cfg = load_config("configs/tiny/mamba2-explicit.yaml", check_files=False)
model = build_model(cfg)
out = Path(OUT) / "export"
export.write_folder(out, model, cfg, torch.float32)  # the export there before (0.8 MB of the 1.2 MB)
before = {p.name: p.read_bytes() for p in out.iterdir()}
with torch.no_grad():
    model.embedding.weight.mul_(2)
try:
    export.write_folder(out, model, cfg, torch.float32)  # no room for a second copy beside it
except OSError as err:
    print(err)
print("LEFT", sorted(p.name for p in Path(OUT).iterdir()), {p.name: p.read_bytes() for p in out.iterdir()} == before)
"""


@pytest.mark.processes
def test_a_re_export_with_room_for_one_copy_says_the_disk_is_full_and_leaves_the_old_one(tmp_path):
    """What `convert_checkpoint.py export` prints after its `convert_checkpoint: `: the folder and the
    cause in words, not safetensors' IoError."""
    result = on_a_small_tmpfs(tmp_path, 'mount -t tmpfs -o size=1200k tmpfs "$OUT"', WRITTEN_ON_A_FULL_DISK)
    out = tmp_path / "out" / "export"
    said, left = result.stdout.splitlines()
    assert said == f"{out}: not written: no space left on device; the folder there before is left as it was", said
    assert left == "LEFT ['export'] True"  # no partial folder left; the old export as it was
