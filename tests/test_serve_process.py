"""`minisgl serve` as the two processes it is: the engine process (the command) and its HTTP front-end child.
Killing either one, or Ctrl-C, ends the whole server clearly and leaves no process behind. And how a command's
process ends (minisgl_cli.process_exit)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import psutil
import pytest

from tests.conftest import free_port, wait_healthy

# Random SmolLM2-135M weights: a CPU step takes long enough that a 400-token answer is still streaming when killed.
SERVE = ["--model", "dummy:SmolLM2-135M", "--device", "cpu", "--num-pages", "256", "--log-level", "warning"]


@contextlib.contextmanager
def serve(*extra: str, sighup: Any = signal.SIG_DFL) -> Iterator[tuple[subprocess.Popen, psutil.Process, str]]:
    """The command, its front-end child and the URL; everything is killed on the way out whatever happened.
    `sighup`: the SIGHUP disposition it starts with (SIG_IGN: started under nohup)."""
    port = free_port()
    cmd = [sys.executable, "-m", "minisgl_cli", "serve", *SERVE, "--port", str(port), *extra]
    # a session of its own: a test can signal the server's process group as a closing terminal does. SIGHUP at its
    # default action unless asked, as in a terminal's session: an ignored SIGHUP is inherited, and serve keeps it
    # ignored (nohup's choice), so under a runner that ignores it (nohup, some CI agents) streams ran to their end.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, sighup),
    )
    url = f"http://127.0.0.1:{port}"
    started: list[psutil.Process] = []
    try:
        wait_healthy(proc, url)
        (front,) = psutil.Process(proc.pid).children()
        started.append(front)
        yield proc, front, url
    finally:
        for p in [psutil.Process(proc.pid)] if proc.poll() is None else []:
            started += p.children(recursive=True)
        proc.kill()
        proc.wait()
        for p in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def streaming(url: str, max_tokens: int = 400):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
    stream = client.completions.create(
        model="dummy:SmolLM2-135M", prompt="hi", max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = iter(stream)
    for _ in range(3):  # the answer is under way
        next(chunks)
    return chunks


def stream_error(chunks) -> str:
    """The message of the APIError that ended the stream; a stream that ends without one fails the test, saying how
    it ended (its last finish_reason) and after how many more chunks."""
    n, last = 0, None
    try:
        for chunk in chunks:
            n, last = n + 1, chunk
    except openai.APIError as e:
        return str(e)
    reason = last.choices[0].finish_reason if last is not None and last.choices else None
    pytest.fail(f"the stream ended without an error after {n} more chunks, the last with finish_reason {reason!r}")


def gone_within(p: psutil.Process, seconds: float) -> bool:
    """Exited (a zombie counts: its parent, the engine process, may be stopped or busy, and not reap it)."""
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
                continue
        return True


def ipc_dir(front: psutil.Process) -> str:
    (ipc,) = {m.group(1) for m in re.finditer(r"ipc://([^\"]+)/commands", " ".join(front.cmdline()))}
    return ipc


def test_killed_engine_ends_open_streams_and_the_front_end():
    """...and its IPC directory, which the engine it killed could not remove, goes with the front end."""
    with serve() as (proc, front, url):
        ipc = ipc_dir(front)
        chunks = streaming(url)
        proc.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(openai.APIError, match="engine process .* exited"):
            for _ in chunks:
                pass
        status = httpx.get(f"{url}/health", timeout=5).status_code
        assert status == 503 and time.monotonic() - t0 < 5
        assert proc.wait(timeout=10) == -signal.SIGKILL  # the command exits non-zero
        assert gone_within(front, 10), "the front end outlived its engine"
        assert not os.path.exists(ipc), ipc


def test_killed_front_end_ends_the_engine_process_naming_it():
    with serve() as (proc, front, url):
        front.kill()
        assert proc.wait(timeout=15) == 1
        out = proc.stdout.read() if proc.stdout else ""
        assert "the HTTP front end exited (killed by SIGKILL)" in out, out[-2000:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_sigterm_or_sighup_leaves_no_process_or_file_behind(sig):
    """SIGHUP (the terminal or ssh session closing) killed the engine process outright: the front end noticed and
    left, but the IPC directory stayed in /tmp."""
    with serve() as (proc, front, url):
        ipc = ipc_dir(front)
        chunks = streaming(url)
        proc.send_signal(sig)
        stream_error(chunks)  # the open stream ends with an error, not a hang
        assert proc.wait(timeout=10) == 0
        assert gone_within(front, 1)
        assert not os.path.exists(ipc), ipc


def test_sighup_to_the_process_group_ends_open_streams_with_the_reason():
    """A closing terminal sends SIGHUP to the whole process group: its default action killed the front end at once,
    so the open streams' connections dropped without the error event the engine's shutdown sends."""
    with serve() as (proc, front, url):
        ipc = ipc_dir(front)
        chunks = streaming(url)
        os.killpg(proc.pid, signal.SIGHUP)
        assert "engine shut down" in stream_error(chunks)
        assert proc.wait(timeout=10) == 0
        assert gone_within(front, 5)
        assert not os.path.exists(ipc), ipc


def test_serve_started_under_nohup_outlives_the_terminal_closing():
    """`nohup minisgl serve ...`: SIGHUP is ignored from the start, and the server keeps it so (its own handler would
    have ended it): the open stream goes on, new requests are served; Ctrl-C still ends it."""
    with serve(sighup=signal.SIG_IGN) as (proc, front, url):
        chunks = streaming(url)
        os.killpg(proc.pid, signal.SIGHUP)
        for _ in range(20):  # tokens keep coming well after the signal
            next(chunks)
        time.sleep(1.5)  # past the engine loop's and the front end's watch periods
        assert proc.poll() is None and front.is_running()
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        proc.send_signal(signal.SIGINT)
        assert "engine shut down" in stream_error(chunks)
        assert proc.wait(timeout=10) == 0


def test_sigterm_to_the_front_end_of_a_stuck_engine_ends_open_streams_with_the_reason():
    """torchrun stops a failed group by SIGTERM to each rank's process group: with rank 0 stopped (SIGSTOP, a hang),
    the front end's uvicorn cut the open streams after 2 s without an error event, and the IPC directory stayed."""
    with serve() as (proc, front, url):
        ipc = ipc_dir(front)
        chunks = streaming(url)
        proc.send_signal(signal.SIGSTOP)
        try:
            front.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            with pytest.raises(httpx.ConnectError):  # no new work once told to stop (it took requests for 5 s)
                httpx.get(f"{url}/health", timeout=5)
            with pytest.raises(openai.APIError, match=r"stopped \(SIGTERM\) and the requests did not end within 5 s"):
                for _ in chunks:
                    pass
            assert gone_within(front, 10), "the front end did not leave"
            assert not os.path.exists(ipc), ipc
        finally:
            proc.send_signal(signal.SIGCONT)
        assert proc.wait(timeout=30) == 1  # the engine, continued, finds its front end gone


def test_step_log_is_written_when_the_server_stops(tmp_path):
    """serve --step-log: the engine process records its steps and writes them on Ctrl-C; they account for every
    token it made (each came from a decode row or a request's last prefill chunk). The log's directory need not
    exist: it is created, as --json's is (the up-front check lets a missing parent pass)."""
    log = tmp_path / "run" / "steps.jsonl"
    with serve("--step-log", str(log)) as (proc, front, url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
        made = 0
        for prompt, n in (([1, 2, 3, 4, 5], 6), ([7, 8, 9], 4)):
            r = client.completions.create(
                model="dummy:SmolLM2-135M", prompt=prompt, max_tokens=n, extra_body={"ignore_eos": True}
            )
            assert r.usage is not None and r.usage.completion_tokens == n
            made += n
        assert not log.exists()  # written when the server stops
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(s["decode_rows"] for s in steps) + 2 == made
    assert sum(s["prefill_tokens"] for s in steps) == 5 + 3
    assert all(a["t"] <= b["t"] for a, b in zip(steps, steps[1:]))


def test_an_fp8_kv_cache_serves_what_the_engine_computes_in_process():
    """`serve --kv-cache-dtype fp8` through the official client: the same engine's greedy tokens and logprobs
    in-process with the fp8 cache, and not those of the model's own dtype."""
    from engine.sampling_params import SamplingParams
    from tests.conftest import make_llm

    with serve("--kv-cache-dtype", "fp8", "--dtype", "float32") as (_, _, url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
        got = client.completions.create(
            model="dummy:SmolLM2-135M", prompt="Paris is", max_tokens=12, temperature=0, logprobs=0
        ).choices[0]
    served = got.logprobs.token_logprobs
    for kv, close in (("fp8", True), ("auto", False)):
        llm = make_llm("dummy:SmolLM2-135M", kv_cache_dtype=kv, num_pages=256)
        p = SamplingParams(max_tokens=12, temperature=0, logprobs=0)
        want = llm.generate([llm.tokenizer.encode("Paris is")], p)[0]
        assert got.text == want.text
        gap = max(abs(a - b.logprob) for a, b in zip(served, want.logprobs))
        assert (gap < 1e-4) == close, (kv, gap)


@pytest.mark.timeout(180)
def test_port_0_serves_on_the_port_the_banner_names():
    """--port 0 takes a free port; the banner names the one bound (it printed ":0"), and the server answers there."""
    cmd = [sys.executable, "-m", "minisgl_cli", "serve", "--model", "dummy:tiny-llama", "--device", "cpu"]
    proc = subprocess.Popen(
        [*cmd, "--port", "0", "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        seen = []
        while not (match := re.search(r"at http://127\.0\.0\.1:(\d+)/v1$", seen[-1] if seen else "")):
            line = proc.stdout.readline()
            assert line, "".join(seen)  # the command ended without a banner
            seen.append(line.rstrip())
        port = int(match.group(1))
        assert port != 0, seen
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
        assert (
            client.completions.create(model="dummy:tiny-llama", prompt="hi", max_tokens=3).usage.completion_tokens == 3
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            for p in psutil.Process(proc.pid).children(recursive=True):
                p.kill()
        proc.kill()
        proc.wait()


def test_a_long_tmpdir_still_gives_the_engine_its_sockets(tmp_path, monkeypatch):
    """A Unix socket's address holds 107 bytes: under a long TMPDIR (an HPC or CI scratch folder) `serve` and `chat`
    loaded the model, then failed to bind ("File name too long") and left their folder behind."""
    import tempfile

    import zmq

    from engine.ipc import Addresses

    long = tmp_path / ("t" * 100)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    addrs = Addresses.temporary()
    ctx = zmq.Context()
    try:
        for address in (addrs.commands, addrs.outputs):
            ctx.socket(zmq.PULL).bind(address)
    finally:
        ctx.destroy(linger=0)  # its sockets too (term() waits for every socket to be closed)
        addrs.remove()
    assert not list(long.iterdir())


def test_socket_folders_of_dead_engines_are_swept(tmp_path, monkeypatch):
    """An engine killed outright leaves its socket folder: hundreds piled up in /tmp. A new one removes this user's
    folders whose socket refuses connections, once they are old enough not to be an engine still starting; a live
    engine's, and anything else named so, stay."""
    import socket as so
    import tempfile

    from engine.ipc import Addresses

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    names = ("dead", "live", "young", "other", "loading")
    dead, live, young, other, loading = (tmp_path / f"minisgl-{n}" for n in names)
    for d in (dead, live, young, other, loading):
        d.mkdir()
    with so.socket(so.AF_UNIX) as s:  # bound, then closed: the file stays and refuses connections
        s.bind(str(dead / "commands"))
    (other / "notes.txt").write_text("not an engine's")
    listening = so.socket(so.AF_UNIX)
    listening.bind(str(live / "commands"))
    listening.listen()
    for d in (dead, live, other, loading):  # loading: an engine still loading its model (it binds after)
        os.utime(d, (time.time() - 600, time.time() - 600))
    try:
        new = Addresses.temporary()
        kept = [d.name.removeprefix("minisgl-") for d in (dead, live, young, other, loading) if d.exists()]
        assert kept == ["live", "young", "other", "loading"]
        new.remove()
    finally:
        listening.close()


def test_an_engine_loop_that_cannot_bind_ends_its_front_end(tmp_path):
    """The engine's sockets cannot bind (their folder's path too long, or the folder gone: a /tmp cleaner while the
    model loaded): the loop's constructor raised before run_beside_front_end's cleanup, leaving the started front end
    running and the folder in place."""
    from engine.engine_loop import engine_info
    from engine.ipc import Addresses
    from minisgl_cli.serve import run_beside_front_end
    from tests.conftest import make_llm

    llm = make_llm()
    # a folder whose socket paths are too long to bind (a Unix socket's address holds 107 bytes)
    where = tmp_path / ("minisgl-" + "x" * 120)
    where.mkdir()
    addrs = Addresses(f"ipc://{where}/commands", f"ipc://{where}/outputs")
    front = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(Exception, match="longer than 107 characters"):
            run_beside_front_end(llm.engine, engine_info(llm), addrs, front, "the front end")
        assert front.poll() is not None and not where.exists()
    finally:
        front.kill()
        front.wait()


@pytest.mark.parametrize("end", ["the front end exits", "SIGTERM"])
def test_an_idle_engine_loop_ends_at_once_when_its_front_end_exits_or_a_signal_comes(end, monkeypatch):
    """An idle loop waits up to IDLE_TICK for a command and looks whether its front end lives every WATCH_EVERY: a
    Ctrl-C'd `serve` and a chat that quit held the terminal up to a second for it. Both are 30 s here; the loop must
    end well before its next look."""
    import threading

    from engine.engine_loop import EngineLoop, engine_info
    from engine.ipc import Addresses
    from minisgl_cli.serve import run_beside_front_end
    from tests.conftest import make_llm

    monkeypatch.setattr(EngineLoop, "IDLE_TICK", 30.0)
    monkeypatch.setattr(EngineLoop, "WATCH_EVERY", 30.0)
    llm = make_llm()
    front = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ending = front.terminate if end == "the front end exits" else lambda: os.kill(os.getpid(), signal.SIGTERM)
    timer = threading.Timer(1.0, ending)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        timer.start()
        started = time.monotonic()
        ended = run_beside_front_end(llm.engine, engine_info(llm), Addresses.temporary(), front, "the front end")
        took = time.monotonic() - started
    finally:
        timer.cancel()
        for s, handler in handlers.items():  # run_beside_front_end installed its own
            signal.signal(s, handler)
        front.kill()
        front.wait()
    assert took < 10, f"the loop ended {took:.1f} s after it started: it waited for its tick"
    if end == "SIGTERM":
        assert ended.signum == signal.SIGTERM and ended.why is None
    else:
        assert ended.stopped_by == "the front end exited (killed by SIGTERM)", ended


@pytest.mark.parametrize("code,status", [(None, 0), (3, 3), ("the reason", 1)])
def test_a_command_ending_without_teardown_still_does_what_a_normal_exit_does(code, status, tmp_path):
    """exit_now skips the interpreter's finalization (0.6 s with torch imported), not what it would have done outside
    the process: output still buffered is written, a thread still running is waited for, atexit handlers run, and
    the status is SystemExit's."""
    script = f"""
import atexit, sys, threading, time
from minisgl_cli.process_exit import exit_now
atexit.register(lambda: open({str(tmp_path / "atexit")!r}, "w").write("ran"))
def late():
    time.sleep(0.5)
    sys.stdout.write(" and the thread's")
threading.Thread(target=late).start()
sys.stdout.write("buffered")
exit_now({code!r})
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (status, "buffered and the thread's"), r
    assert r.stderr == ("the reason\n" if status == 1 else ""), r.stderr
    assert (tmp_path / "atexit").read_text() == "ran"
