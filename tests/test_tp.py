"""Tensor parallelism on CPU (gloo): TP=2 (the MoE model: attention, a dense layer and a sparse one) and TP=3 (SmolLM2)
give the same tokens as TP=1; a rank that dies or hangs ends the whole group."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from engine.config import EngineConfig
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from tests.conftest import free_port, run_with_children, subprocess_env, torchrun_cmd, wait_healthy
from tests.fuzz_workloads import Reference
from tests.test_engine import tiny_dir  # noqa: F401  (the peaked-weight tiny Llama fixture)
from tests.tp_cases import ENGINE, PARAMS, prompts
from tests.tp_fuzz import SETTINGS, Plan, draw_workloads

ROOT = Path(__file__).resolve().parent.parent


def tp_run(model: str, n: int, tmp_path: Path, kv_cache_dtype: str = "auto") -> dict:
    out = tmp_path / f"tp{n}.json"
    env = subprocess_env(OMP_NUM_THREADS="1", MINISGL_DIST_TIMEOUT="120")
    cmd = torchrun_cmd(n, str(ROOT / "tests" / "tp_generate.py"), model, str(out), kv_cache_dtype)
    proc = run_with_children(cmd, 600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def tp1(model: str, kv_cache_dtype: str = "auto") -> dict:
    llm = LLM(EngineConfig(model=model, kv_cache_dtype=kv_cache_dtype, **ENGINE))
    return {name: [o.token_ids for o in llm.generate(prompts(model), p)] for name, p in PARAMS.items()}


@pytest.mark.parametrize("model,n", [("dummy:tiny-qwen3-moe", 2), (None, 3)], ids=["tiny-qwen3-moe-tp2", "smollm2-tp3"])
def test_tensor_parallel_matches_single_process(model, n, tmp_path):
    model_arg = model or str(__import__("engine.model_source", fromlist=["x"]).embedded_default_path())
    expected = tp1(model_arg)
    got = tp_run(model_arg, n, tmp_path)
    assert got["greedy"] == expected["greedy"]
    assert got["seeded"] == expected["seeded"]  # rank 0 samples and broadcasts: no divergence under sampling
    if model is not None:  # the tiny model: a Ctrl-C on rank 0 mid-step ended that generate() with KeyboardInterrupt
        # once the step was done, and the group went on in lockstep (it hung: rank 0 left the step between collectives)
        assert got["interrupted"] and got["after_ctrl_c"] == expected["greedy"]
    # The followers ran their steps as rank 0's step loops do: heap frozen, full collections only when idle.
    from engine.gc_heap import FULL_COLLECTIONS_OFF

    for rank in range(1, n):
        seen = json.loads((tmp_path / f"tp{n}.json.rank{rank}").read_text())
        assert seen["steps"] and all(t == FULL_COLLECTIONS_OFF and frozen > 10_000 for t, frozen in seen["steps"])
        assert not any(seen["full_with_work"]), seen["full_with_work"]


@pytest.mark.parametrize("n", [2, 3])
def test_row_parallel_add_into_sums_the_residual_once(n):
    """tests/tp_linear.py under torchrun: the folded layers' residual add in o_proj's and down_proj's GEMMs (CUDA)
    under tensor parallelism: rank 0 adds, the others write their parts, every rank ends with residual + x W^T."""
    env = subprocess_env(OMP_NUM_THREADS="1", MINISGL_DIST_TIMEOUT="60")
    proc = run_with_children(torchrun_cmd(n, str(ROOT / "tests" / "tp_linear.py")), 120, env=env, cwd=ROOT)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_tensor_parallel_with_an_fp8_kv_cache_matches_single_process(tmp_path):
    """Each rank stores its KV heads' share in e4m3: the same tokens as one process with the same fp8 cache."""
    expected = tp1("dummy:tiny-qwen3-moe", "fp8")
    got = tp_run("dummy:tiny-qwen3-moe", 2, tmp_path, "fp8")
    assert got["greedy"] == expected["greedy"] and got["seeded"] == expected["seeded"]
    assert expected["greedy"] != tp1("dummy:tiny-qwen3-moe")["greedy"]  # the fp8 cache was in use


def test_the_python_api_at_tp2_refuses_what_would_mix_ranks_and_starts_twice(tmp_path):
    """tests/tp_api.py under torchrun: a rank > 0's add_request is refused (its prompt ran on rank 0's request of the
    same rid); a second LLM after the first's shutdown joins a group of its own and computes the same tokens (it
    failed to connect, or hung, on the first group's stale addresses); ranks with different --page-size are refused
    on both ranks, naming it (they fell out of lockstep at the first prefix hit), and leave the group."""
    env = subprocess_env(OMP_NUM_THREADS="1", MINISGL_DIST_TIMEOUT="60")
    cmd = torchrun_cmd(2, str(ROOT / "tests" / "tp_api.py"), str(tmp_path / "api"))
    proc = run_with_children(cmd, 300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"api.rank{r}.json").read_text()) for r in (0, 1))
    assert "rank 1 of a tensor-parallel group takes no requests: submit them on rank 0 only" in rank1["refused"]
    assert rank0["second"] == rank0["first"] == tp1_greedy()
    for seen in (rank0, rank1):
        assert "ranks were started with different engine settings" in seen["different"]
        assert "rank 1: page_size=8 (rank 0: 4)" in seen["different"]
        assert seen["left"]  # the refused start's group was torn down (it stayed to interpreter exit, which aborted
        # rank 1 in ~1 run of 4: "terminate called without an active exception")
    assert rank0["third"] == rank0["first"]


def tp1_greedy() -> list[list[int]]:
    llm = LLM(EngineConfig(model="dummy:tiny-llama", device="cpu", page_size=4, num_pages=256))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    return [list(o.token_ids) for o in llm.generate([[1, 2, 3], [4, 5, 6, 7]], params)]


# Per engine setting of tests/tp_fuzz.py: 8 are ~1,500 TP=2 steps, ~25 s of this test on a 2-core CPU.
TP_FUZZ_WORKLOADS = 100 if os.environ.get("MINISGL_SLOW") else 8


def test_random_workloads_at_tp2_keep_every_promise_on_every_rank(tiny_dir, tmp_path):  # noqa: F811
    """The fuzz of tests/test_fuzz_engine.py at TP=2 (tests/tp_fuzz.py under torchrun): seeded workloads (arrivals at
    random steps, shared prefixes, twins, aborts, stops, a request refused at admission) through one engine per
    setting; every request ends once with its TP=1 tokens run alone, and every rank's page accounting holds after
    every step, equals rank 0's, and is back to nothing in use after each workload. MINISGL_TP_FUZZ_SEED=N draws
    other workloads (a failure names the seed, engine and workload)."""
    seed = int(os.environ.get("MINISGL_TP_FUZZ_SEED", "0"))
    rng = random.Random(seed)
    engines = [(name, s, draw_workloads(rng, s, TP_FUZZ_WORKLOADS)) for name, s in SETTINGS.items()]
    reference = Reference(tiny_dir)  # TP=1, computed here: a torchrun rank cannot start a TP=1 engine
    for _, _, workloads in engines:
        for arrivals, _ in workloads:
            for a in arrivals:
                reference.run(a.prompt, reference.params(a))
    plan = tmp_path / "plan.pickle"
    plan.write_bytes(pickle.dumps(Plan(tiny_dir, seed, engines, reference.memo)))
    out = tmp_path / "fuzz"
    env = subprocess_env(OMP_NUM_THREADS="1", MINISGL_DIST_TIMEOUT="60")
    cmd = torchrun_cmd(2, str(ROOT / "tests" / "tp_fuzz.py"), str(plan), str(out))
    proc = run_with_children(cmd, timeout=60 * TP_FUZZ_WORKLOADS, env=env, cwd=ROOT)
    if proc.returncode != 0:
        case = Path(f"{out}.case").read_text() if Path(f"{out}.case").exists() else "the start"
        failure = Path(f"{out}.failure")  # rank 0's failed check; else a rank left the group (a check of its own)
        ranks = [line for line in proc.stderr.splitlines() if line.startswith("minisgl: rank")]
        why = failure.read_text() if failure.exists() else "\n".join(ranks) or proc.stderr[-4000:]
        pytest.fail(f"TP fuzz (MINISGL_TP_FUZZ_SEED={seed}) failed at {case}:\n{why}")
    rank0, rank1 = (json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1))
    labels = [(name, i) for name, _, workloads in engines for i in range(len(workloads))]
    assert len(rank0["boundaries"]) == len(labels)

    def at(step: int) -> str:  # the workload a step belongs to (or an engine's shutdown, between two engines' runs)
        k = next((k for k, b in enumerate(rank0["boundaries"]) if step < b), None)
        if k is None:
            return f"seed {seed}, the last engine's shutdown"
        shutdown = " (or the shutdown of the engine before)" if k and labels[k][1] == 0 else ""
        return f"seed {seed}, engine {labels[k][0]!r}, workload {labels[k][1]}{shutdown}"

    assert len(rank1["steps"]) == len(rank0["steps"]), "the ranks ran different numbers of steps"
    for i, (r0, r1) in enumerate(zip(rank0["steps"], rank1["steps"])):
        # [free, evictable, in use, live, requests known, digest of the queues, pages, tokens and endings]
        assert r1 == r0, f"step {i}: rank 1's pages and requests {r1} != rank 0's {r0}, at {at(i)}"
    for rank in (rank0, rank1):  # after each workload, on every rank: nothing runs, no page is in use
        for b in rank0["boundaries"]:
            assert rank["steps"][b - 1][2:5] == [0, 0, 0], f"pages or requests left after {at(b - 1)}"
    for what in rank0["stats"][0]:  # the draws made each case happen (the seed is fixed: a change of draws shows)
        assert any(s[what] for s in rank0["stats"]), f"no workload {what}"


def test_a_run_out_of_time_leaves_no_process_it_started_behind(tmp_path):
    """The TP fuzz's torchrun runs under run_with_children: torchrun starts each rank in a session of its own, and
    subprocess.run's timeout killed torchrun alone, leaving the ranks running on after the test."""
    pid_file = tmp_path / "child.pid"
    script = (  # a child in a session of its own, as torchrun's ranks are
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        "open(sys.argv[1], 'w').write(str(p.pid))\n"
        "time.sleep(120)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        run_with_children([sys.executable, "-c", script, str(pid_file)], timeout=8)
    child = psutil.Process(int(pid_file.read_text()))

    def gone() -> bool:  # or dead, not yet reaped by whoever adopted it
        with contextlib.suppress(psutil.NoSuchProcess):
            return child.status() == psutil.STATUS_ZOMBIE
        return True

    deadline = time.monotonic() + 10
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not gone():
        child.kill()
        pytest.fail("the child in a session of its own outlived the run's timeout")


def test_tp_size_must_match_world_and_divide_heads(monkeypatch):
    with pytest.raises(ValueError, match="torchrun --nproc-per-node 2"):
        LLM(EngineConfig(model="dummy:tiny-llama", device="cpu", tp=2))
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun's 2 processes, --tp left out: it said "--tp 1 needs exactly 1"
    with pytest.raises(ValueError, match=r"this run has 2 processes \(torchrun, WORLD_SIZE=2\): add --tp 2"):
        LLM(EngineConfig(model="dummy:tiny-llama", device="cpu"))


def _left_running(out: Path) -> list[int]:
    """The ranks of tests/tp_start_fail.py (pids it wrote to OUT.rankN.pid) still running."""
    pids = [int(p.read_text()) for p in out.parent.glob(f"{out.name}.rank*.pid")]
    assert len(pids) == 2, pids
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


START_FAILED = "cannot read model.safetensors: Permission denied (injected)"  # tests/tp_start_fail.py's


@pytest.mark.parametrize("fail_rank", [1, 0])
def test_a_start_that_fails_on_one_rank_is_raised_on_every_rank_naming_it(fail_rank, tmp_path):
    """The Python API under torchrun: one rank's model load raises and its script goes on (catches the error). That
    rank kept its group, so the other waited in the start's all-reduce for MINISGL_DIST_TIMEOUT (600 s here, the
    default) and then raised a bare gloo timeout. Now the failing rank leaves the group, the other raises at once
    naming the rank and its error, and both have left their group: a later engine starts on both."""
    out = tmp_path / "start"
    env = subprocess_env(OMP_NUM_THREADS="1", MINISGL_DIST_TIMEOUT="600")
    cmd = torchrun_cmd(2, str(ROOT / "tests" / "tp_start_fail.py"), str(fail_rank), str(out), "api")
    proc = run_with_children(cmd, 60, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed, other = (json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (fail_rank, 1 - fail_rank))
    assert failed["error"] == f"OSError: {START_FAILED}"
    assert other["error"] == f"TPStartFailed: rank {fail_rank} failed to start its engine (OSError: {START_FAILED})"
    assert failed["left"] and other["left"]
    assert other["seconds"] < 30, other
    assert (failed.get("second") or other.get("second")) == tp1_greedy()[0][:4]  # a later engine starts and computes
    assert not _left_running(out)


@pytest.mark.parametrize("fail_rank", [1, 0])
def test_serve_tp2_whose_start_fails_on_one_rank_ends_naming_it_and_frees_the_port(fail_rank, tmp_path):
    """`serve --tp 2` whose model load fails on one rank: it said `error: ...` without the rank, and the other rank
    died of a gloo "Connection closed by peer" traceback. Now the failing rank says which it is and why in one line,
    exits 2, torchrun ends the group, no rank is left and rank 0's HTTP port is free again."""
    out, port = tmp_path / "serve", free_port()
    env = subprocess_env(OMP_NUM_THREADS="1", MINISGL_DIST_TIMEOUT="600")
    cmd = torchrun_cmd(2, str(ROOT / "tests" / "tp_start_fail.py"), str(fail_rank), str(out))
    cmd += ["serve", "--model", "dummy:tiny-llama", "--device", "cpu", "--tp", "2", "--num-pages", "64"]
    cmd += ["--port", str(port), "--log-level", "warning"]
    proc = run_with_children(cmd, 60, env=env, cwd=ROOT)
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr
    assert f"error: rank {fail_rank}: {START_FAILED}\n" in said, said[-3000:]
    assert "]: Traceback" not in said, said[-3000:]  # a rank's traceback ([rank0]: ...), not torchrun's own
    assert not _left_running(out)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# ---- a rank that dies or stops answering ends the whole group ------------------------------------------------------


def _serve_tp2(timeout_s: int, model: str, device: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = subprocess_env(OMP_NUM_THREADS="1", MINISGL_DIST_TIMEOUT=str(timeout_s))
    cmd = torchrun_cmd(
        2,
        "-m",
        "minisgl_cli",
        "serve",
        "--model",
        model,
        "--device",
        device,
        "--tp",
        "2",
        "--port",
        str(port),
        "--log-level",
        "warning",
    )
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )  # one process group: the test can always clean it all up
    return proc, f"http://127.0.0.1:{port}"


def _ranks(launcher: int) -> dict[int, int]:
    """{local rank: pid} of torchrun's live worker processes."""
    ranks = {}
    for pid in map(int, Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()):
        try:
            env = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in v)
        except OSError:  # gone meanwhile
            continue
        if "LOCAL_RANK" in env:  # an exited, not yet reaped worker shows no environment
            ranks[int(env["LOCAL_RANK"])] = pid
    return ranks


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds torchrun's workers through /proc (Linux)")
@pytest.mark.parametrize("how", ["killed", "stuck"])
def test_a_rank_that_dies_or_hangs_ends_the_group(how):
    out = check_group_ends(how, "dummy:tiny-llama", "cpu")
    if how == "stuck":  # rank 0's collective timed out and it says so before leaving
        assert "minisgl: rank 0: tensor-parallel group failed" in out and "Timed out" in out, out[-3000:]


def check_group_ends(how: str, model: str, device: str) -> str:
    """`serve --tp 2` with a long answer in flight; rank 1 is SIGKILLed ("killed") or SIGSTOPped ("stuck"). The
    whole group must end and the client get an error. Returns torchrun's output (also used by tests/test_gpu.py)."""
    proc, url = _serve_tp2(10, model, device)
    try:
        wait_healthy(proc, url, timeout=180)
        follower = _ranks(proc.pid)[1]
        # A long answer in flight on rank 0 when the group breaks: its client must get an error, not wait forever.
        answer: dict = {}

        def ask() -> None:
            try:
                answer["status"] = httpx.post(
                    url + "/v1/completions", timeout=120, json={"model": model, "prompt": "hi", "max_tokens": 1500}
                ).status_code
            except httpx.HTTPError as e:
                answer["error"] = type(e).__name__

        client = threading.Thread(target=ask)
        client.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        os.kill(follower, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        if how == "stuck":  # rank 0 must give up by itself after MINISGL_DIST_TIMEOUT (10 s), not serve on
            while 0 in _ranks(proc.pid) and time.monotonic() - t0 < 60:
                time.sleep(0.5)
            assert 0 not in _ranks(proc.pid), "rank 0 still running 60 s after its peer stopped answering"
            os.kill(follower, signal.SIGCONT)  # so torchrun's SIGTERM reaches it (else torchrun kills it in 30 s)
        out = proc.communicate(timeout=120)[0]
        client.join(timeout=30)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0, out[-3000:]
    assert "error" in answer or answer.get("status", 200) >= 500, answer  # an error, not a hang or a fake answer
    if how == "killed":  # torchrun names the rank that died
        assert "rank      : 1" in out and "SIGKILL" in out, out[-3000:]
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds torchrun's workers through /proc (Linux)")
@pytest.mark.parametrize("how", ["SIGTERM", "launcher killed"])
def test_sigterm_or_a_killed_launcher_ends_the_tp_server_cleanly(how):
    """`serve --tp 2` stopped by SIGTERM to torchrun (`kill`, docker stop), which forwards it to every rank: rank 1
    died of it at once, so rank 0 said "tensor-parallel group failed", its clients got "the engine process exited"
    and the IPC directory stayed in /tmp. And torchrun killed outright (SIGKILL, the OOM killer): both ranks and the
    front end served on, for good. Now the open stream ends with the reason and nothing is left."""
    proc, url = _serve_tp2(60, "dummy:tiny-llama", "cpu")
    try:
        wait_healthy(proc, url, timeout=180)
        ranks = _ranks(proc.pid)
        (front,) = [c for c in psutil.Process(ranks[0]).children() if "frontend" in " ".join(c.cmdline())]
        (ipc,) = {m.group(1) for m in re.finditer(r"ipc://([^\"]+)/commands", " ".join(front.cmdline()))}
        group = [psutil.Process(pid) for pid in ranks.values()] + [front]
        body = {"model": "dummy:tiny-llama", "prompt": "hi", "max_tokens": 1500, "stream": True, "ignore_eos": True}
        events: list[str] = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            while len(events) < 3:  # the answer is under way
                events += [line for line in [next(lines)] if line.startswith("data:")]
            os.kill(proc.pid, signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
            events += [line for line in lines if line.startswith("data:")]
        out = proc.communicate(timeout=60)[0]
        assert all(_gone_within(p, 20) for p in group), [p.pid for p in group if p.is_running()]
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        for pid in ranks.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    why = "engine shut down" if how == "SIGTERM" else f"the torchrun launcher (pid {proc.pid}) exited"
    assert any(why in e for e in events[3:]), events[-3:]
    assert "tensor-parallel group failed" not in (out or ""), (out or "")[-3000:]
    assert not os.path.exists(ipc), ipc


def _gone_within(p: psutil.Process, seconds: float) -> bool:
    with contextlib.suppress(psutil.TimeoutExpired, psutil.NoSuchProcess):
        p.wait(timeout=seconds)
    return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE


def test_chat_at_tp2_answers_from_rank_0_and_ends_the_group():
    """`chat --tp 2` under torchrun: rank 0 runs the engine loop beside the chat's process (as `serve` does), rank 1
    follows; two piped turns are answered and Ctrl-D (end of input) ends every process with exit 0."""
    env = subprocess_env(OMP_NUM_THREADS="1")
    cmd = torchrun_cmd(2, "-m", "minisgl_cli")
    cmd += ["chat", "--no-tui", "--no-save", "--model", "dummy:tiny-llama", "--device", "cpu", "--tp", "2"]
    cmd += ["--max-tokens", "6", "--num-pages", "256"]
    p = run_with_children(cmd, 300, input="hello\nsecond\n", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "TP 2" in p.stderr
    assert p.stderr.count("[length · TTFT") == 2, p.stderr[-3000:]


def test_a_ctrl_c_during_a_tp_step_is_raised_after_it_and_a_second_one_at_once():
    """Rank 0's steps under TP run in ctrl_c_after_step: one Ctrl-C waits for the step's end (the ranks stay in
    lockstep); a second in the same step (one hanging on a peer that is gone) is raised at once."""
    from engine.distributed import ctrl_c_after_step

    assert threading.current_thread() is threading.main_thread()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    done = []
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_after_step():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("step finished")
    assert done == ["step finished"]
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_after_step():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            done.append("the hung step went on")
    assert done == ["step finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
