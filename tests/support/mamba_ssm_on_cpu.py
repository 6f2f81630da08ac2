"""mamba_ssm's own Triton kernels on CPU tensors, through Triton's interpreter (the kernel tier).

With TRITON_INTERPRET=1, Triton runs a kernel's Python body on the host over numpy views of the
tensors' memory, so the kernels' real code (indexing, masks, chunk boundaries, `seq_idx` resets,
the backward's accumulations) runs on every commit. mamba_ssm assumes a GPU in a few host-side lines;
each shim below names the line of mamba_ssm 2.3.2.post1 it stands in for. causal_conv1d (CUDA C++
only) is support.causal_conv1d_stand_in. float32 only: numpy has no bfloat16, and bf16 inputs give
wrong results under the interpreter.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Iterator

import pytest
import torch

from implicit_megatron.models import kernels
from support import causal_conv1d_stand_in
from support.processes import ROOT

INSTALL = "bash scripts/setup.sh dev,eval,kernels"


def _pinned() -> str:
    """The mamba_ssm the tier checks (pyproject.toml), which scripts/setup.sh installs with `kernels`."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the dev extra's tomli
        import tomli as tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["implicit-megatron"]["kernel-tier-mamba-ssm"]


MAMBA_SSM_VERSION = _pinned()


def unavailable() -> str | None:
    """Why mamba_ssm's kernels cannot run here (one line), or None."""
    for package in ("triton", "mamba_ssm"):
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed ({INSTALL} installs it)"
    found = importlib.metadata.version("mamba_ssm")
    if found != MAMBA_SSM_VERSION:
        return f"mamba_ssm {found} is installed; the kernel tier checks {MAMBA_SSM_VERSION} ({INSTALL})"
    return None


def _package_without_init() -> types.ModuleType:
    """Stands in for mamba_ssm/__init__.py, whose line 3 imports ops/selective_scan_interface.py, whose
    line 20 imports the Mamba-1 CUDA extension `selective_scan_cuda` (and every module, transformers
    among them): the Triton kernels under mamba_ssm.ops.triton import on their own."""
    spec = importlib.util.find_spec("mamba_ssm")
    assert spec is not None and spec.submodule_search_locations is not None
    package = types.ModuleType("mamba_ssm")
    package.__path__ = list(spec.submodule_search_locations)
    package.__version__ = MAMBA_SSM_VERSION
    return package


def _no_device(index: int | None) -> contextlib.AbstractContextManager:
    """Stands in for `with torch.cuda.device(x.device.index):` around every launch (e.g.
    ops/triton/ssd_chunk_scan.py:1390, selective_state_update.py:200): a CPU tensor's index is None."""
    return contextlib.nullcontext()


def _device_properties(device=None) -> types.SimpleNamespace:
    """Stands in for `torch.cuda.get_device_properties(dout.device).multi_processor_count` in the
    backward (ops/triton/ssd_chunk_scan.py:1485 and 1534, layernorm_gated.py:309), which sizes the
    partial sums of dD and the norm's weight gradient by the number of SMs."""
    return types.SimpleNamespace(multi_processor_count=4, name="Triton interpreter")


def _cheapest_config(self, kwargs: dict) -> list:
    """Stands in for the benchmark of every config at the first launch of a shape (triton's
    Autotuner.run, reached from each @triton.autotune of ops/triton/ssd_*.py), which times them
    through a GPU driver: the one with the smallest blocks, as mamba_ssm's deterministic mode picks
    (utils/determinism.py:_estimate_config_cost); any config computes the same, and small blocks cost
    the interpreter least."""
    from mamba_ssm.utils.determinism import _estimate_config_cost

    return [min(self.configs, key=_estimate_config_cost)]


def _interpreted_language(patch: pytest.MonkeyPatch) -> None:
    """Stands in for importing triton with TRITON_INTERPRET=1 already set: triton.language's own
    @triton.jit functions (tl.sum, tl.max, tl.cumsum and their combine functions, called by every
    kernel of mamba_ssm, e.g. selective_state_update.py:127) are decorated when triton is imported,
    and where that happened before the tier (transformers probes mamba_ssm, whose __init__ imports
    triton) they are compiled-mode functions the interpreter cannot call."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    interpreted: dict[int, InterpretedFunction] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("triton.language"):
            continue
        for attribute, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                patch.setattr(module, attribute, interpreted.setdefault(id(value), InterpretedFunction(value.fn)))


OWN = ("mamba_ssm", "causal_conv1d")  # the packages whose modules the context puts in sys.modules


def _own_modules() -> dict[str, types.ModuleType]:
    return {name: module for name, module in sys.modules.items() if name.split(".")[0] in OWN}


@contextlib.contextmanager
def on_cpu() -> Iterator[kernels.MambaKernels]:
    """The Mamba kernels the mixer calls, runnable on CPU tensors until the context ends. mamba_ssm's
    modules are imported afresh (a failed `import mamba_ssm` elsewhere, transformers' probe of it,
    leaves some behind, compiled for a GPU) and are gone from sys.modules again afterwards."""
    reason = unavailable()
    if reason:
        pytest.skip(f"kernel tier: {reason}")
    saved = _own_modules()
    for name in saved:
        del sys.modules[name]
    kernels._load_mamba_kernels.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TRITON_INTERPRET", "1")  # read when a kernel is decorated (its import) and when it runs
            sys.modules.update(causal_conv1d_stand_in.modules())  # before mamba_ssm, which looks it up at import
            sys.modules["mamba_ssm"] = _package_without_init()
            patch.setattr(torch.cuda, "device", _no_device)
            patch.setattr(torch.cuda, "get_device_properties", _device_properties)
            import triton.runtime.autotuner

            patch.setattr(triton.runtime.autotuner.Autotuner, "prune_configs", _cheapest_config)
            _interpreted_language(patch)
            import mamba_ssm.ops.triton.selective_state_update  # noqa: F401 - an import error surfaces here
            import mamba_ssm.ops.triton.ssd_combined  # noqa: F401

            loaded = kernels._load_mamba_kernels()
            assert loaded is not None, "the project's loader found no kernels where mamba_ssm imports"
            yield loaded
    finally:
        kernels._load_mamba_kernels.cache_clear()
        for name in _own_modules():
            del sys.modules[name]
        sys.modules.update(saved)
