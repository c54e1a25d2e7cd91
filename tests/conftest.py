"""Shared fixtures: the real embedded model (session-wide), tiny random models, GPU skipping; serve-process helpers."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.llm import LLM

# One intra-op thread: the suite runs engine threads, servers and UIs beside the test thread on 2 cores, where
# OpenMP workers spinning for a core slowed tiny-model steps ~45x (0.025 s vs 1.1 s) and starved the TUI tests.
torch.set_num_threads(int(os.environ.get("MINISGL_TEST_THREADS", "1")))
# And one in every process the suite starts (servers, chats, benchmarks, their engine processes): each took torch's
# default of one thread per core, whose OpenMP workers spun beside the other worker's tests. test_serve_process.py and
# test_chat_remote.py: 159 CPU-s and 107 s with them, 127 CPU-s and 94 s without (2 cores, -n 2).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The Ctrl-C tests signal this process (or a child) and expect Python's handling of SIGINT. A run started as a
# background job of a shell without job control (`pytest ... &` in a script) inherits SIGINT ignored, as does every
# child it starts: bench-trace's in-process Ctrl-C test then waited out its server's 60 s and failed.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# On a CPU with native bf16 `--dtype auto` means bf16; the suite compares with HF in fp32 (engine.cpu), here and in
# the serve / chat processes it starts (they inherit the environment).
os.environ.setdefault("MINISGL_CPU_DTYPE", "float32")
# One weight cache per test process, in a fresh temporary directory: the first load of the embedded GGUF (read and
# dequantized by the engine itself) fills it, and every later load (servers, chats, tensor-parallel ranks) reads
# the saved copy instead of spending ~30 s on the GGUF and its tokenizer again. tests/test_weight_cache.py checks
# that a cached load equals the GGUF load; it and the bad-model-file tests use caches of their own.
# (pytest-xdist's workers inherit the first process's directory; only that process removes it.)
os.environ.setdefault("MINISGL_WEIGHT_CACHE", "1")
if "MINISGL_CACHE_DIR" not in os.environ:
    os.environ["MINISGL_CACHE_DIR"] = tempfile.mkdtemp(prefix="minisgl-test-cache-")
    atexit.register(shutil.rmtree, os.environ["MINISGL_CACHE_DIR"], ignore_errors=True)


# The files that take longest on the 2-core CI machine, started first, longest first (seconds of test time each, from
# `pytest -n 2 --durations=0` at 56f5f8f summed per file: 199 down to 15). pytest-xdist hands a worker the next file
# when it runs low, in collection order (--no-loadscope-reorder: by default it orders files by their number of tests,
# which put the one-test fuzz file last, alone on one worker while the other sat idle); the short files go last and
# even the two workers' ends out. Re-measure when a file grows: a long file left off this list starts late.
LONGEST_FIRST = (
    "test_tp.py",
    "test_bench_serve.py",
    "test_serve_process.py",
    "test_chat_sessions.py",
    "test_bench_offline.py",
    "test_chat_plain.py",
    "test_chat_tui.py",
    "test_serve.py",
    "test_chat_remote.py",
    "test_bench_trace.py",
    "test_chat_terminal.py",
    "test_openai_api.py",
    "test_async_llm_api.py",
    "test_llm_api.py",
    "test_bad_input.py",
    "test_chat_sampling.py",
    "test_hf_equivalence.py",
    "test_fuzz_engine.py",
    "test_weight_cache.py",
    "test_text.py",
    "test_cpu_ops.py",
    "test_bench_compare.py",
    "test_faults.py",
    "test_kv_fp8.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_slow = pytest.mark.skip(reason="slow: set MINISGL_SLOW=1")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not os.environ.get("MINISGL_SLOW"):
            item.add_marker(skip_slow)


@pytest.fixture(autouse=True)
def private_data_dir(tmp_path_factory, monkeypatch):
    """No test writes to the real user's data dir: `minisgl chat` (in-process or a subprocess) saves its sessions
    under a fresh XDG_DATA_HOME."""
    path = tmp_path_factory.mktemp("xdg-data")
    monkeypatch.setenv("XDG_DATA_HOME", str(path))
    return path


def make_llm(model: str | None = "dummy:tiny-llama", **kw) -> LLM:
    """A CPU engine that checks page accounting after every step."""
    kw.setdefault("device", "cpu")
    kw.setdefault("dtype", "float32")
    kw.setdefault("check_invariants", True)
    return LLM(EngineConfig(model=model, **kw))


def checked(llm: LLM) -> LLM:
    """`llm` after its page-accounting check; on an engine thread: `async_llm.call(lambda llm: checked(llm)...)`."""
    llm.engine.check()
    return llm


@pytest.fixture(scope="session")
def smollm() -> LLM:
    """The embedded SmolLM2-135M-Instruct (real weights, real tokenizer), fp32 on CPU."""
    return make_llm(None, max_running_requests=32)


@pytest.fixture(scope="session")
def hf_smollm():
    """The same SmolLM2 in Hugging Face transformers (fp32), which dequantizes the GGUF file with its own reader: an
    independent reference. Reading the GGUF takes ~27 s on the 2-core machine, so the first test process to need it
    saves what transformers made (config, generation config, weights) in the suite's cache directory, and the other
    processes (xdist workers) rebuild the model from that in ~4 s: the same weights, bit for bit."""
    import fcntl

    import transformers
    from transformers import AutoModelForCausalLM

    from engine.model_source import embedded_default_path

    path = embedded_default_path()
    cache = Path(os.environ["MINISGL_CACHE_DIR"])  # a fresh one per suite unless the caller set it: key the copy
    saved = cache / f"hf-smollm2-{transformers.__version__}-{path.stat().st_size}.pt"
    with open(cache / "hf-smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second worker waits for the first one's copy
        if saved.exists():
            blob = torch.load(saved, weights_only=False)
            hf = AutoModelForCausalLM.from_config(blob["config"], dtype=torch.float32)
            hf.load_state_dict(blob["state"])
            hf.generation_config = blob["generation"]
            return hf.eval()
        with gguf_read_once():
            hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        hf.eval()
        part = saved.with_suffix(".part")  # a process killed while writing leaves no half copy under the name
        torch.save({"config": hf.config, "generation": hf.generation_config, "state": hf.state_dict()}, part)
        part.replace(saved)
        return hf


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """transformers' GGUF load with two of gguf-py's pure functions memoized, the same weights bit for bit: it parses
    the file's metadata twice (a GGUFReader for the config, another for the tensors) and builds gguf-py's whole
    tensor-name map once per module of the model (397 times for SmolLM2). 19.8 s -> 9.1 s on a 2-core machine."""
    import gguf

    originals = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.cache(gguf.GGUFReader)  # type: ignore[assignment,misc]  # a class's constructor, memoized
    gguf.get_tensor_name_map = functools.cache(gguf.get_tensor_name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = originals  # type: ignore[misc]


# ---- child processes: the CLI, torchrun groups, servers (no openai here: the GPU machine lacks it) ------------------

REPO = Path(__file__).resolve().parent.parent


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment with the checkout first on PYTHONPATH (a child imports this code, whatever else the path
    holds: the GPU machine's package bundle), plus `extra`."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


def torchrun_cmd(nproc: int, *args: str) -> list[str]:
    """torchrun through this interpreter: `nproc` ranks on this host running `args` (a script and its arguments, or
    -m module ...)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone", *args]


def run_with_children(cmd: list[str], timeout: float, input: str | None = None, **kw) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, **kw), but out of time (or
    interrupted) it kills every process `cmd` started too: torchrun starts each rank in a session of its own, and
    subprocess.run killed torchrun alone, so a timed-out TP run's ranks ran on after the test (rank 0 of the TP fuzz
    for minutes)."""
    import psutil

    stdin = subprocess.PIPE if input is not None else None
    proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except BaseException:
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def sigint_once_shown(cmd: list[str], shown: bytes, timeout: float = 180.0) -> tuple[int, bytes, bytes]:
    """Run a minisgl command as from a terminal (its live view on), send it SIGINT once its output matches the regex
    `shown`, and return its exit status and its whole stdout and stderr (what was read while watching included)."""
    import re
    import select

    p = subprocess.Popen(
        cmd,
        env=subprocess_env(COLUMNS="200", TTY_COMPATIBLE="1", TTY_INTERACTIVE="1"),  # the live view, to be watched
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background job ignores SIGINT
    )
    assert p.stdout is not None and p.stderr is not None
    read = {p.stdout: b"", p.stderr: b""}
    t0 = time.monotonic()
    while not re.search(shown, b"".join(read.values())):
        seen = b"".join(read.values()).decode(errors="replace")[-2000:]
        assert time.monotonic() - t0 < timeout and p.poll() is None, seen
        for f in select.select(list(read), [], [], 0.1)[0]:
            read[f] += os.read(f.fileno(), 1 << 16)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    return p.returncode, read[p.stdout] + stdout, read[p.stderr] + stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 120.0) -> None:
    """Poll the server process's /health until it answers 200; fail with its output if it exits or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, (proc.communicate()[0] or "")[-3000:]
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        assert time.monotonic() < deadline, f"{url} did not come up in {timeout:.0f} s"
        time.sleep(0.3)


@contextlib.contextmanager
def serve_subprocess(
    log_dir: Path, *args: str, model: str = "dummy:tiny-llama", env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real `minisgl serve` of a CPU model (the tiny one unless told; plus `args`, and `env` added to this
    environment) in its own process group: the engine process and its HTTP front end. Yields (url, process); on the
    way out everything it started is ended."""
    port = free_port()
    log_path = log_dir / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "minisgl_cli", "serve", "--model", model, "--device", "cpu"]
    cmd += ["--port", str(port), "--log-level", "warning", *args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        try:
            try:
                wait_healthy(proc, f"http://127.0.0.1:{port}")
            except AssertionError as e:
                raise AssertionError(f"{e}\n{log_path.read_text()[-3000:]}") from e
            yield f"http://127.0.0.1:{port}", proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever else the server started


def _peaked(tmp_path_factory, name: str, **shape: int) -> str:
    from dataclasses import replace

    from engine.model_config import PRESETS
    from tests.hf_reference import hf_model_from_config, save_hf

    cfg = replace(PRESETS["SmolLM2-135M"], num_layers=4, **shape)  # type: ignore[arg-type]
    return str(save_hf(hf_model_from_config(cfg, seed=5, std=0.08), tmp_path_factory.mktemp(name) / "m"))


@pytest.fixture(scope="module")
def peaked_model(tmp_path_factory) -> str:
    """SmolLM2's shapes, 4 layers, weights large enough that greedy picks are not bf16 near-ties
    (dummy weights give near-flat logits, where any change of summation order may flip a token)."""
    return _peaked(tmp_path_factory, "peaked")


@pytest.fixture(scope="module")
def peaked_model_d128(tmp_path_factory) -> str:
    """peaked_model with heads of 128 dims, two query heads per KV head (Qwen3-0.6B's head shape): the shapes the
    GPU's bf16 decode runs through the project's CUDA kernel (kernels/attention/cuda_decode.py), not FlashInfer's."""
    return _peaked(tmp_path_factory, "peaked_d128", num_heads=6, num_kv_heads=3, head_dim=128)
