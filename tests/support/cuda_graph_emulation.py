"""CUDA graphs emulated on the CPU, so that every line of the graph path runs in CI.

A real CUDA graph records kernels while a stream is captured and replays them later. Each kernel
keeps the addresses it was captured with: it reads its inputs where they were at capture, whatever
Python objects now stand for that memory, and it writes its outputs into the same buffers at
every replay. Nothing runs during capture, so what a capture returns holds garbage until the first
replay. This module gives CPU tensors the same semantics:

- `EmulatedGraph.capture_begin/capture_end` record every ATen operation (forward and backward ops
  alike) through a dispatch mode. Each tensor argument is remembered by address: its storage,
  offset, sizes, strides and dtype. Storages made during the capture are the graph's own memory
  (its pool) and are kept; any other storage is only weakly referenced, as a GPU would not keep it.
- `replay()` runs the recorded operations again on the memory they were recorded with: fresh
  tensors are built over the recorded storages (so autograd's version counters do not move, as
  kernels do not move them), results are written into the recorded outputs, in-place operations
  write where they wrote. A storage freed since capture makes replay fail loudly ("reads freed
  memory") where a GPU would silently read whatever now lives there.
- At the end of a capture, floating-point memory made during it is filled with NaN and external
  memory the capture wrote to is restored: a capture computes nothing.
- Host synchronisation inside a capture (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `nonzero`,
  `bincount`, `torch.equal`, `torch.cuda.synchronize`, ...) raises, as `cudaStreamCapture` does; so
  does a copy from pageable host memory (a tensor made from Python or numpy data), a nested capture
  and a replay during a capture.
- A Triton kernel launched through Triton's interpreter (the kernel tier runs mamba_ssm's kernels so,
  support.mamba_ssm_on_cpu) is recorded as one operation with its tensors by address, and run at
  each replay only, as a GPU runs a captured kernel.
- Streams: `torch.cuda.current_stream()` is the stream last made current (by `torch.cuda.stream`
  or `set_stream`), as on a GPU, so a test sees which stream the code is left on. A capture can be
  made to fail at its end (`EmulatedGraph.fail_capture_end`), as a capture invalidated by an
  illegal operation does on a GPU.

`install()` patches `torch.cuda`'s graph primitives (CUDAGraph, graph_pool_handle, streams,
synchronize, empty_cache, is_current_stream_capturing) and the device the project's graph code
accepts; torch's own `torch.cuda.graph` and `torch.cuda.make_graphed_callables`, which are Python
over those primitives, then run unchanged. What is not emulated: memory reuse between graphs that
share a pool (the project gives graphs whose memory must outlive a replay pools of their own),
and timing.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

SYNCHRONISING = {"_local_scalar_dense", "nonzero", "equal", "is_nonzero", "masked_select", "unique",
                 "_unique2", "repeat_interleave", "bincount"}
HOST_COPIES = {"lift_fresh", "lift_fresh_copy"}  # a tensor from Python or numpy data: a copy from pageable memory


class CaptureError(RuntimeError):
    """What CUDA reports for an operation that is not permitted while a stream is captured."""


@dataclass
class _Ref:
    """A tensor argument remembered by address: how a replay finds the same memory again."""

    storage: torch.UntypedStorage | None  # the graph's own memory (kept alive)
    weak: StorageWeakRef | None  # memory the graph does not own
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    def tensor(self) -> torch.Tensor:
        storage = self.storage
        if storage is None:
            if self.weak.expired():
                raise RuntimeError(f"replay reads freed memory: a {self.dtype} tensor of shape {list(self.size)} "
                                   "that the graph read by address at capture has been freed")
            storage = torch.UntypedStorage._new_with_weak_ptr(self.weak.cdata)
        return torch.empty(0, dtype=self.dtype).set_(storage, self.offset, self.size, self.stride)


@dataclass
class _Op:
    func: object
    args: tuple  # the arguments with a _Ref for each tensor (ATen's: tensors, lists of them, plain values)
    kwargs: dict
    outputs: list[_Ref | None]  # where a replay writes each result (None: an alias of an input or not a tensor)


def _with_refs(value, ref):
    """`value` with each tensor in it (at any depth of lists and tuples) replaced by ref(tensor)."""
    if isinstance(value, torch.Tensor):
        return ref(value)
    if type(value) in (list, tuple):
        return type(value)(_with_refs(item, ref) for item in value)
    return value


def _tensors_at(value):
    """The value of a recorded argument at replay: each _Ref a tensor over its memory again (a walk
    of lists and tuples only, which is all an ATen signature holds: many times faster than a pytree)."""
    if type(value) is _Ref:
        return value.tensor()
    if type(value) in (list, tuple):
        return type(value)(_tensors_at(item) for item in value)
    return value


def _flat(value) -> list:
    """An ATen result's items in order: a tensor, a tuple or list of them (at any depth), or a plain value."""
    if type(value) in (list, tuple):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


_state = {"capturing": None, "replaying": False}
_pools = itertools.count(1)


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: EmulatedGraph) -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in SYNCHRONISING:
            raise CaptureError(f"operation not permitted when stream is capturing ({func}): a host "
                               "synchronisation inside a CUDA graph capture")
        if name in HOST_COPIES:
            raise CaptureError(f"operation not permitted when stream is capturing ({func}): a copy from "
                               "pageable host memory inside a CUDA graph capture")
        leaves = _flat(tuple(args)) + _flat(tuple(kwargs.values()))
        self.graph._protect_external_writes(func, args, kwargs)
        inputs = {t.untyped_storage().data_ptr() for t in leaves if isinstance(t, torch.Tensor)}
        recorded = (_with_refs(tuple(args), self.graph._ref),
                    {name: _with_refs(value, self.graph._ref) for name, value in kwargs.items()})
        result = func(*args, **kwargs)
        outputs = []
        for out in _flat(result):
            if not isinstance(out, torch.Tensor) or func.is_view or out.untyped_storage().data_ptr() in inputs:
                outputs.append(None)  # a view or an in-place result: its memory is an input's
            else:
                self.graph._own(out)
                outputs.append(self.graph._ref(out))
        self.graph.ops.append(_Op(func, *recorded, outputs))
        return result


class EmulatedGraph:
    """torch.cuda.CUDAGraph over CPU tensors; see the module docstring."""

    fail_capture_end = False  # a test sets it: the next capture fails at its end, as an invalidated one does

    def __init__(self, keep_graph: bool = False) -> None:
        self.ops: list[_Op] = []
        self.owned: dict[int, torch.UntypedStorage] = {}
        self.floating: dict[int, bool] = {}  # integer memory is not poisoned: garbage indices only crash
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # external memory written during capture
        self.captured = False
        self._pool = None
        self._recorder = None

    def capture_begin(self, pool=None, capture_error_mode: str = "global", check_input_liveness: bool = False):
        if _state["capturing"] is not None:
            raise CaptureError("a CUDA graph is already being captured")
        if self.captured:
            raise CaptureError("this CUDAGraph was captured already (reset it first)")
        self._pool = pool if pool is not None else next(_pools)
        _state["capturing"] = self
        self._recorder = _Recorder(self)
        self._recorder.__enter__()

    def capture_end(self) -> None:
        self._recorder.__exit__(None, None, None)
        _state["capturing"] = None
        if EmulatedGraph.fail_capture_end:
            EmulatedGraph.fail_capture_end = False
            self.reset()
            raise CaptureError("operation failed due to a previous error during capture (the capture was "
                               "invalidated)")
        self.captured = True
        with torch.no_grad():
            for target, value in self.saved.values():  # a capture computes nothing
                target.copy_(value)
            for key, storage in self.owned.items():
                if self.floating[key]:  # bytes of 0xFF are NaN in every floating dtype
                    storage.fill_(0xFF)
        self.saved.clear()

    def replay(self) -> None:
        if _state["capturing"] is not None:
            raise CaptureError("a CUDA graph cannot be replayed while a capture is under way")
        if not self.captured:
            raise RuntimeError("replay of a CUDA graph that was never captured")
        _state["replaying"] = True
        try:
            self._run()
        finally:
            _state["replaying"] = False

    def _run(self) -> None:
        with torch.no_grad():
            for op in self.ops:
                kwargs = {name: _tensors_at(value) for name, value in op.kwargs.items()}
                results = _flat(op.func(*_tensors_at(op.args), **kwargs))
                for target, value in zip(op.outputs, results, strict=True):
                    if target is not None:
                        target.tensor().copy_(value)

    def reset(self) -> None:
        self.ops, self.owned, self.floating, self.captured = [], {}, {}, False

    def pool(self):
        return self._pool

    # -- capture bookkeeping

    def _own(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        self.owned[storage.data_ptr()] = storage
        self.floating[storage.data_ptr()] = t.is_floating_point()

    def _ref(self, t: torch.Tensor) -> _Ref:
        storage = t.untyped_storage()
        owned = self.owned.get(storage.data_ptr())
        if owned is None and storage.nbytes() == 0:
            owned = storage
        weak = None if owned is not None else StorageWeakRef(storage)
        return _Ref(owned, weak, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)

    def _protect_external_writes(self, func, args, kwargs) -> None:
        """Remember external memory that an operation of the capture is about to write."""
        schema = func._schema
        for i, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(argument.name)
            for t in (value if isinstance(value, (list, tuple)) else [value]):
                if not isinstance(t, torch.Tensor):
                    continue
                key = t.untyped_storage().data_ptr()
                if key not in self.owned and key not in self.saved:
                    whole = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
                    self.saved[key] = (whole, whole.clone())


def replaying() -> bool:
    """Whether an emulated graph is being replayed (what a GPU would do without the host)."""
    return _state["replaying"]


def _graph_pool_handle():
    return next(_pools)


class _Stream:
    """A stream that is the one CPU queue: waits and synchronisation are no-ops."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        _refuse_during_capture("torch.cuda.Stream.synchronize")

    def record_event(self, event=None):
        return event


_DEFAULT_STREAM = _Stream()
_state["stream"] = _DEFAULT_STREAM


def _current_stream(device=None) -> _Stream:
    return _state["stream"]


def _set_stream(stream) -> None:
    _state["stream"] = stream


class _StreamContext:
    """torch.cuda.stream(s): `s` is current until the context ends, then the one before it again
    (torch.cuda.graph enters and leaves it by hand, as this emulates)."""

    def __init__(self, stream) -> None:
        self.stream, self.before = stream, None

    def __enter__(self):
        self.before = _state["stream"]
        if self.stream is not None:
            _state["stream"] = self.stream
        return self.stream

    def __exit__(self, *exc) -> None:
        _state["stream"] = self.before


def _refuse_during_capture(what: str) -> None:
    if _state["capturing"] is not None:
        raise CaptureError(f"operation not permitted when stream is capturing ({what}): a host synchronisation "
                           "inside a CUDA graph capture")


def _synchronize(device=None) -> None:
    _refuse_during_capture("torch.cuda.synchronize")


def _host_read(method):
    """A tensor method that copies to the host (`.cpu()`, `.tolist()`, `.numpy()`): refused in a capture."""

    def read(self, *args, **kwargs):
        _refuse_during_capture(f"Tensor.{method.__name__}")
        return method(self, *args, **kwargs)

    return read


class _Launch:
    """A Triton kernel launch as a recorded operation: the interpreter's grid executor, called again."""

    def __init__(self, launch, executor) -> None:
        self.launch, self.executor = launch, executor

    def __call__(self, *args, **kwargs) -> None:
        self.launch(self.executor, *args, **kwargs)


def _recorded_launch(launch):
    """Triton's interpreted launch (GridExecutor.__call__): inside a capture, remembered and not run
    (it reads and writes raw memory, which the dispatch mode cannot see)."""

    def call(executor, *args, **kwargs):
        graph = _state["capturing"]
        if graph is None:
            return launch(executor, *args, **kwargs)
        graph.ops.append(_Op(_Launch(launch, executor), _with_refs(tuple(args), graph._ref),
                             {name: _with_refs(value, graph._ref) for name, value in kwargs.items()}, [None]))
        return None

    return call


def install() -> callable:
    """Patch torch.cuda's graph primitives with the emulation; returns a function that undoes it."""
    from implicit_megatron.implicit import graphs as graphs_lib

    patches = [(torch.cuda, "CUDAGraph", EmulatedGraph), (torch.cuda.graphs, "CUDAGraph", EmulatedGraph),
               (torch.cuda, "graph_pool_handle", _graph_pool_handle),
               (torch.cuda.graphs, "graph_pool_handle", _graph_pool_handle),
               (torch.cuda, "is_current_stream_capturing", lambda: _state["capturing"] is not None),
               (torch.cuda.graphs, "is_current_stream_capturing", lambda: _state["capturing"] is not None),
               (torch.cuda, "Stream", _Stream), (torch.cuda, "stream", _StreamContext),
               (torch.cuda, "current_stream", _current_stream), (torch.cuda, "set_stream", _set_stream),
               (torch.cuda, "synchronize", _synchronize),
               *[(torch.Tensor, name, _host_read(getattr(torch.Tensor, name))) for name in ("cpu", "tolist", "numpy")],
               (torch.cuda, "empty_cache", lambda: None), (torch._C, "_host_emptyCache", lambda: None),
               (torch.cuda.graphs.graph, "default_capture_stream", None),
               (graphs_lib, "GRAPH_DEVICE", "cpu")]
    interpreter = sys.modules.get("triton.runtime.interpreter")  # imported by the kernel tier only
    if interpreter is not None:
        patches.append((interpreter.GridExecutor, "__call__", _recorded_launch(interpreter.GridExecutor.__call__)))
    missing = object()
    old = [(owner, name, getattr(owner, name, missing)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)

    def undo() -> None:
        _state["stream"] = _DEFAULT_STREAM
        for owner, name, value in reversed(old):
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)

    return undo


@contextlib.contextmanager
def emulated():
    undo = install()
    try:
        yield
    finally:
        undo()
