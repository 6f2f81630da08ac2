"""Fixtures shared by the whole suite, and its two tiers.

Tiers: a test that starts another process (a training launch, a tool, a daemon, a worker pool) is
marked `processes`, one that trains in-process for more than about ten seconds `slow`, one of the
kernel tier (tests/kernels/: mamba_ssm's Triton kernels on CPU) `kernels`; `pytest --quick`
(scripts/test.sh --quick) runs the others, the edit loop's tier. The mark is not left to
memory: everywhere, a test that starts a process without it fails, naming the command (tests/
distributed, tests/e2e and tests/integration are marked as a whole).
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import child_env, free_port, run_torchrun
from support.reference_runs import TINY, zero1_overrides
from support.shared import built_once

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
pytest_plugins = ["pytester"]  # tests/unit/test_tiers.py runs the tiers on a suite of its own
# folders of tests/ whose every test starts processes
STARTS_PROCESSES = ("distributed", "e2e", "integration", "multinode")
# fixtures that start processes: a test using one (even through another) is marked
PROCESS_FIXTURES = {"zero1_run", "llama_run", "zero3_run"}


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help="the tests that start no process, are not slow and run no kernels (the edit loop's tier)")


def pytest_configure(config):
    """matplotlib lists the machine's fonts once per machine, by running `fc-list` where fontconfig
    is installed (the multi-node tier's packages bring it): do it here, before any test, or the
    first unmarked test that draws a plot would be refused for starting that process. Once, in the
    controller, before pytest-xdist starts its workers."""
    original = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    os.environ.setdefault("HF_HOME", str(original / "huggingface"))  # these stay where they are when
    os.environ.setdefault("MPLCONFIGDIR", str(original / "matplotlib"))  # _a_user_cache_of_its_own moves it
    if not hasattr(config, "workerinput"):
        with contextlib.suppress(ImportError):
            import matplotlib.font_manager  # noqa: F401 - builds or reads the font list cache


@pytest.fixture(scope="session", autouse=True)
def _a_user_cache_of_its_own(tmp_path_factory):
    """The packed-sample index cache is in the user's cache (data_pipeline.index_cache): the suite's
    is its own, so that a run of it neither reads nor fills the machine's."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("user-cache"))


def pytest_collection_modifyitems(config, items):
    quick, kept, dropped = config.getoption("--quick"), [], []
    for item in items:
        if _folder(item) in STARTS_PROCESSES or item.get_closest_marker("distributed") or \
                PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)
        if _folder(item) == "kernels":
            item.add_marker(pytest.mark.kernels)
        left_out = any(item.get_closest_marker(mark) for mark in ("processes", "slow", "kernels"))
        (dropped if quick and left_out else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    items[:] = start_order(kept, workers)


def _folder(item) -> str:
    """The folder of tests/ that holds the test (unit, distributed, e2e, ...)."""
    return Path(item.path).relative_to(Path(__file__).parent).parts[0]


def _weight(item) -> float:
    """A rough cost of a test: a multi-node test (minutes of waiting on daemons and nodes), a slow or
    multi-process one, one that starts a process, one in-process."""
    if _folder(item) == "multinode":
        return 4.0
    if _folder(item) == "distributed" or item.get_closest_marker("slow") or item.get_closest_marker("distributed"):
        return 3.0
    if item.get_closest_marker("kernels"):
        return 2.0  # seconds each under Triton's interpreter: a module goes to one worker, dealt like a long one
    return 1.0 if item.get_closest_marker("processes") else 0.05


def start_order(items: list, workers: int) -> list:
    """The order the tests start in, longest first, a module at a time (its fixtures set up once).
    Under pytest-xdist (worksteal) each worker is first handed an equal, contiguous share of the list:
    the long modules are dealt among the shares (each to the one with the least so far) and every
    share ends with the short in-process tests, so that no worker starts a minute-long launch while
    the others have run dry, and the short tests fill the ends."""
    modules: dict = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    weights = {path: [_weight(item) for item in module] for path, module in modules.items()}
    ranked = sorted(modules, key=lambda path: -max(weights[path]))  # stable: the collection's order among equals
    if workers < 2:
        return [item for path in ranked for item in modules[path]]
    short = [item for path in ranked if max(weights[path]) < 1.0 for item in modules[path]]
    shares: list[list] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for path in (path for path in ranked if max(weights[path]) >= 1.0):
        share = loads.index(min(loads))
        shares[share].extend(modules[path])
        loads[share] += sum(weights[path])
    left = len(items)
    for index, share in enumerate(shares):  # the sizes worksteal hands out: what is left // workers left
        size = left // (workers - index)
        take = max(0, size - len(share))
        share.extend(short[:take])
        del short[:take]
        left -= size
    shares[-1].extend(short)
    return [item for share in shares for item in share]


class UnmarkedProcess(RuntimeError):
    pass


def _refuse_process(what: str):
    def refuse(self, *args, **kwargs):
        command = getattr(self, "args", None) or getattr(self, "_target", None) or "?"
        raise UnmarkedProcess(f"this test starts a process ({what}: {command!r}) but is not marked "
                              "@pytest.mark.processes, so `--quick` would run it")
    return refuse


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _processes_allowed(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _processes_allowed(item):
        return (yield)


class _processes_allowed:  # noqa: N801 - used as a context manager
    """Within an unmarked test's setup and call, starting a subprocess or a multiprocessing worker
    raises UnmarkedProcess (session fixtures that start processes are set up by the first test that
    asks for them, so a test that only reads their output is caught too)."""

    def __init__(self, item) -> None:
        self.guard = item.get_closest_marker("processes") is None

    def __enter__(self):
        if self.guard:
            self.saved = subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start
            subprocess.Popen._execute_child = _refuse_process("subprocess")
            multiprocessing.process.BaseProcess.start = _refuse_process("multiprocessing")
        return self

    def __exit__(self, *exc):
        if self.guard:
            subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start = self.saved
        return False


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """In-process tests run tiny tensors: a thread pool only adds barriers (seconds per test on a
    busy 2-core machine). Processes the tests start get OMP_NUM_THREADS=1 from support.processes."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _grad_mode_left_as_found():
    """A test (or the tool it calls in-process) that turns autograd off for good breaks every
    later training test with a puzzling 'does not require grad': name the culprit instead."""
    import torch

    yield
    if not torch.is_grad_enabled():
        torch.set_grad_enabled(True)
        pytest.fail("autograd was left disabled (torch.set_grad_enabled(False) outside a with-block)")


@pytest.fixture(autouse=True)
def _signals_left_as_found():
    """Processes inherit blocked and ignored signals: a test (or a library it runs in-process, even
    from C) that leaves SIGINT or SIGTERM blocked or ignored makes every later launch deaf to Ctrl-C
    or to a stop (a shell cannot even trap a signal ignored at its start): name the culprit."""
    before = _signal_state()
    yield
    after = _signal_state()
    if after != before:
        pytest.fail(f"the test changed the signals this process passes on to the ones it starts: {before} -> "
                    f"{after}")


def _signal_state() -> dict[str, list[str]]:
    """SIGINT and SIGTERM among the blocked and ignored signals, as the kernel has them (a C library
    can change them behind Python's signal module)."""
    import signal

    watched = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}
    state = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("SigBlk", "SigIgn"):
                mask = int(value, 16)
                state[key] = [name for number, name in watched.items() if mask >> (number - 1) & 1]
    return state


@pytest.fixture(scope="session")
def shakespeare_shards(tmp_path_factory) -> str:
    """The bundled corpus tokenized with the tiny configs' 1000-token BPE: a shard prefix (train/valid/test),
    built once per test run; read-only (their sample-index caches are in the user's cache)."""

    def preprocess(folder: Path) -> None:  # in this process (--workers 0): the same shards, no process started
        from data_pipeline.preprocess import main

        with contextlib.chdir(ROOT):
            code = main(["--input", "data/corpus/shakespeare.jsonl.zst", "--tokenizer",
                         "data/tokenizers/shakespeare-bpe-1000.json.xz", "--output-prefix", str(folder / "bpe1000"),
                         "--workers", "0", "--append-eod", "--valid-fraction", "0.05", "--test-fraction", "0.05",
                         "--quiet"])
        assert code == 0, f"preprocessing the bundled corpus ended with {code}"

    return str(built_once(tmp_path_factory, "shards", preprocess) / "bpe1000")


@pytest.fixture
def one_rank(monkeypatch):
    """A world of one process in the test's own process, set up as a launcher would (RANK, LOCAL_RANK,
    WORLD_SIZE, a free port). Afterwards the process group is torn down and DeepSpeed forgets the copy
    of it it keeps (groups._WORLD_GROUP): a later engine in this worker would broadcast over the
    destroyed group ("Group ... is not registered")."""
    import torch.distributed as dist

    from implicit_megatron.utils.ports import free_port

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "LOCAL_RANK": "0",
                       "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    if "deepspeed.utils.groups" in sys.modules:
        sys.modules["deepspeed.utils.groups"]._WORLD_GROUP = None


@pytest.fixture(scope="session")
def tiny_run(shakespeare_shards, tmp_path_factory):
    """A tiny trained implicit Mamba2 as an export and as a run folder (support.tiny_model), trained
    once per test run; each worker gets its own copy, since the tools write into both folders."""
    from support.tiny_model import TinyRun, train_tiny

    trained = built_once(tmp_path_factory, "tiny-eval-model", lambda folder: train_tiny(folder, shakespeare_shards))
    own = Path(shutil.copytree(trained, tmp_path_factory.mktemp("tiny-eval-copy"), dirs_exist_ok=True))
    return TinyRun(own / "export", own / "run")


@pytest.fixture(scope="session")
def zero1_run(shakespeare_shards, tmp_path_factory) -> Path:
    """The run folder of ZERO1_RUN (support.reference_runs), straight through: the losses that resumes
    of the same run, and the same run over two nodes, must repeat. Tests read it, or copy it first."""

    def train(folder: Path) -> None:
        result = run_torchrun("-m", "implicit_megatron.train", TINY, *zero1_overrides(shakespeare_shards, folder))
        first = result.stdout.find("Traceback")  # the rank that failed first, before the others' echoes of it
        assert result.returncode == 0, (result.stdout[first:first + 4000] if first >= 0 else "") + "\n...\n" + \
            result.stdout[-3000:]

    return built_once(tmp_path_factory, "zero1-run", train)


@pytest.fixture(scope="session")
def llama_run(shakespeare_shards, tmp_path_factory) -> Path:
    """The tiny implicit Llama with weight norm, 6 steps on 2 processes under ZeRO-0, launched as a
    user launches it (launch/pretrain.sh, NPROC=2), validated at the end; its output beside the run
    folder in `pretrain.log`. Read by the launcher's test and the export's; copy it to change it."""

    def train(folder: Path) -> None:
        run = folder / "run"
        result = subprocess.run(["bash", "launch/pretrain.sh", "configs/tiny/llama-implicit.yaml",
                                 f"data.prefixes=[{shakespeare_shards}]", "data.source=null", f"train.output_dir={run}",
                                 "train.steps=6", "train.eval_interval=6", "tracking.enabled=false",
                                 "implicit.weight_norm=true", "distributed.zero_stage=0"], cwd=ROOT,
                                env=child_env(PYTHON=sys.executable, NPROC="2", MASTER_PORT=str(free_port())),
                                capture_output=True, text=True, timeout=300)
        (folder / "pretrain.log").write_text(result.stdout + result.stderr)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    return built_once(tmp_path_factory, "llama-run", train) / "run"


@pytest.fixture(scope="session")
def zero3_run(shakespeare_shards, tmp_path_factory) -> Path:
    """The tiny implicit Mamba2 with weight norm, 30 steps on 2 processes under ZeRO-3 (parameters,
    gradients and optimizer state partitioned), validated at the end: the run that shows ZeRO-3
    learns, and whose shards the export consolidates. Read only."""

    def train(folder: Path) -> None:
        result = run_torchrun("-m", "implicit_megatron.train", TINY, f"data.prefixes=[{shakespeare_shards}]",
                              "data.source=null", f"train.output_dir={folder}", "train.steps=30",
                              "train.eval_interval=30", "train.log_interval=1", "tracking.enabled=false",
                              "implicit.weight_norm=true", "distributed.zero_stage=3")
        assert result.returncode == 0, result.stdout[-3000:]

    return built_once(tmp_path_factory, "zero3-run", train)
