"""A bounded soak of `minisgl serve` on loopback: mixed load for a fixed time, then proof that nothing leaked.

Starts `minisgl serve` on a free 127.0.0.1 port (by default a tiny Llama with peaked random weights, so greedy answers
do not flip under batching), warms it up, then for --duration seconds --clients concurrent clients send a mix of
completions and chat requests, streaming and not, sampled and greedy, some with stop strings. Some clients hang up
mid-stream or give up waiting; some send a bad request on purpose (a 400 is expected). Every answer is checked: status,
shape, token count, stop strings cut, [DONE] at the end of a stream, and greedy probes equal to their answer on the
idle server. At the end the server must be idle (nothing running, waiting or in flight), every KV page free or
evictable, /health 200, its RSS within --rss-slack-mb of the warm baseline, and it must exit cleanly on Ctrl-C.
Prints a rich table, writes JSON (--json), exits 1 on any failure.

    python benchmarks/soak.py --duration 120 --json benchmarks/results/soak_cpu_120s.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.hf_reference builds the peaked model

from minisgl_cli.report import environment, fmt, write_json  # noqa: E402

KINDS = {
    "completion": 3,
    "completion stream": 3,
    "chat": 2,
    "chat stream": 2,
    "hang up mid-stream": 2,
    "give up waiting": 1,
    "bad request": 1,
    "greedy probe": 1,
    "api fields": 2,  # n, logprobs, echo (max_tokens 0), lists of prompts, logit_bias, min_tokens
    "api fields stream": 1,
}
WORDS = "the a KV page cache radix tree token stream batch prefill decode request engine server soak".split()
PREFIXES = [
    "",
    "System: you are a terse assistant that answers in one line.\n",
    "Context: the quick brown fox jumps over the lazy dog, twice, and then rests.\n",
]
PROBES = ["probe one: count the pages", "probe two: " + "ab" * 40, "Context: the quick brown fox jumps over"]
BAD: list[tuple[dict[str, Any], str]] = [
    ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ({"prompt": [1, 2, 99999]}, "prompt"),
    ({"prompt": "x" * 3000}, "prompt"),
    ({"prompt": "hi", "n": 0}, "n"),
    ({"prompt": "hi", "n": 100, "max_tokens": 100}, "n"),  # more than the KV cache holds at once
    ({"prompt": "hi", "logprobs": 21}, "logprobs"),
    ({"prompt": "hi", "logit_bias": {"99999": 5}}, "logit_bias"),
    ({"prompt": "hi", "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": []}, "messages"),
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),
]


@dataclass
class Tally:
    outcomes: Counter = field(default_factory=Counter)  # ok | hung up | gave up | refused (intended) | unexpected
    kinds: Counter = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    tokens: int = 0

    def bad(self, why: str) -> None:
        self.outcomes["unexpected"] += 1
        if len(self.unexpected) < 20:
            self.unexpected.append(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc (Linux only)")


def peaked_model(where: Path) -> str:
    from engine.model_config import PRESETS
    from tests.hf_reference import hf_model_from_config, save_hf

    return str(save_hf(hf_model_from_config(PRESETS["tiny-llama"], seed=7), where / "tiny-llama-peaked"))


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    """The server's /metrics as {name: value} (finish reasons as name[reason]; histograms left out)."""
    out: dict[str, float] = {}
    for line in (await client.get("/metrics")).text.splitlines():
        if not line or line.startswith("#") or "_bucket{" in line:
            continue
        key, value = line.rsplit(" ", 1)
        name = key.split("{", 1)[0].removeprefix("minisgl:")
        if m := re.search(r'finished_reason="([^"]*)"', key):
            name += f"[{m.group(1)}]"
        out[name] = float(value)
    return out


async def wait_idle(client: httpx.AsyncClient, timeout: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = await scrape(client)
        idle = m["num_requests_running"] == m["num_requests_waiting"] == m["num_requests_in_flight"] == 0
        if (idle and m["kv_cache_usage_perc"] == 0) or time.monotonic() > deadline:
            return m
        await asyncio.sleep(0.1)


def make_body(rng: random.Random, chat: bool, stream: bool) -> dict[str, Any]:
    text = rng.choice(PREFIXES) + " ".join(rng.choices(WORDS, k=rng.randint(1, 40)))
    body: dict[str, Any] = {"max_tokens": rng.randint(1, 64), "ignore_eos": True, "stream": stream}
    body.update({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text})
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body.update(temperature=0.8, top_p=0.95, seed=rng.randrange(2**31))
    if rng.random() < 0.3:
        body["stop"] = [rng.choice(string.ascii_letters)]
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def api_body(rng: random.Random, chat: bool, stream: bool) -> dict[str, Any]:
    """A request with the fields evaluation harnesses send: n, logprobs, echo (also with max_tokens 0), lists of
    prompts, logit_bias (a banned token), min_tokens. ignore_eos and no stop strings: every choice runs to length."""
    n_tokens = rng.randint(1, 16)
    body: dict[str, Any] = {
        "max_tokens": n_tokens,
        "ignore_eos": True,
        "n": rng.randint(1, 3),
        "temperature": rng.choice([0, 0.8]),
        "seed": rng.randrange(2**31),
        "return_tokens_as_token_ids": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if rng.random() < 0.5:
        body["logit_bias"] = {str(rng.randrange(256)): -100}
    if rng.random() < 0.3:
        body["min_tokens"] = rng.randint(0, n_tokens)

    def text() -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(1, 20)))

    if chat:
        body["messages"] = [{"role": "user", "content": text()}]
        if rng.random() < 0.7:
            body.update(logprobs=True, top_logprobs=rng.randint(0, 5))
        return body
    body["prompt"] = [text() for _ in range(rng.randint(2, 4))] if rng.random() < 0.4 else text()
    if rng.random() < 0.7:
        body["logprobs"] = rng.randint(0, 5)
    if rng.random() < 0.3:
        body["echo"] = True
        if rng.random() < 0.5:
            body["max_tokens"] = 0
            body.pop("min_tokens", None)
    return body


def check_api_answer(body: dict, choices: list[dict], completion_tokens: int | None, chat: bool) -> str | None:
    """What is wrong with the choices of an api_body request (streamed ones merged per index), or None."""
    n_prompts = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1
    want, per = n_prompts * body["n"], body["max_tokens"]
    if sorted(c["index"] for c in choices) != list(range(want)):
        return f"choice indices {[c['index'] for c in choices]} for {n_prompts} prompts x n {body['n']}"
    if completion_tokens != want * per:
        return f"completion_tokens {completion_tokens} for {want} choices of {per} tokens"
    banned = {int(t) for t in body.get("logit_bias", {})}
    for c in choices:
        if c["finish_reason"] != "length":
            return f"finish_reason {c['finish_reason']!r} with ignore_eos"
        lp = c.get("logprobs")
        if (lp is not None) != (body.get("logprobs") is not None and body.get("logprobs") is not False):
            return f"logprobs {'given' if lp else 'missing'} for logprobs={body.get('logprobs')!r}"
        if lp is None:
            continue
        tokens = [e["token"] for e in lp["content"]] if chat else lp["tokens"]
        ids = [int(t.removeprefix("token_id:")) for t in tokens][len(tokens) - per :] if per else []
        if len(tokens) < per or (not body.get("echo") and len(tokens) != per):
            return f"{len(tokens)} logprob entries for {per} tokens (echo {body.get('echo')})"
        if banned & set(ids):
            return f"token {banned & set(ids)} emitted despite logit_bias -100"
    return None


async def read_api_stream(r: httpx.Response, chat: bool) -> tuple[list[dict], int | None, str | None]:
    """An api_body stream merged per choice index: (choices, completion tokens, error)."""
    merged: dict[int, dict] = {}
    used, done = None, False
    async for line in r.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        chunk = json.loads(line[6:])
        if "error" in chunk:
            return [], used, f"error event: {chunk['error'].get('message')}"
        for c in chunk.get("choices", []):
            m = merged.setdefault(c["index"], {"index": c["index"], "finish_reason": None, "logprobs": None})
            m["finish_reason"] = c.get("finish_reason") or m["finish_reason"]
            lp = c.get("logprobs")
            if lp and chat:
                m["logprobs"] = {"content": (m["logprobs"] or {"content": []})["content"] + lp["content"]}
            elif lp:
                m["logprobs"] = {"tokens": (m["logprobs"] or {"tokens": []})["tokens"] + lp["tokens"]}
        if chunk.get("usage"):
            used = chunk["usage"]["completion_tokens"]
    return list(merged.values()), used, None if done else "stream ended without [DONE]"


def check_answer(body: dict, text: str, reason: str | None, completion_tokens: int | None) -> str | None:
    """What is wrong with a finished answer, or None."""
    if reason not in ("length", "stop"):
        return f"finish_reason {reason!r}"
    if completion_tokens is None or not 1 <= completion_tokens <= body["max_tokens"]:
        return f"completion_tokens {completion_tokens} for max_tokens {body['max_tokens']}"
    if reason == "length" and completion_tokens != body["max_tokens"]:
        return f"finished by length after {completion_tokens} of {body['max_tokens']} tokens"
    if reason == "stop" and "stop" not in body:
        return "finish_reason 'stop' with ignore_eos and no stop string"
    if any(s in text for s in body.get("stop", [])):
        return f"stop string {body['stop']} left in the text"
    return None


async def read_stream(r: httpx.Response, chat: bool) -> tuple[str, str | None, int | None, str | None]:
    """(text, finish_reason, completion tokens, error) of an SSE answer."""
    text, reason, used, done = "", None, None, False
    async for line in r.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            break
        chunk = json.loads(line[6:])
        if "error" in chunk:
            return text, reason, used, f"error event: {chunk['error'].get('message')}"
        for c in chunk.get("choices", []):
            text += (c.get("delta", {}).get("content") or "") if chat else c.get("text", "")
            reason = c.get("finish_reason") or reason
        if chunk.get("usage"):
            used = chunk["usage"]["completion_tokens"]
    return text, reason, used, None if done else "stream ended without [DONE]"


async def one_request(
    client: httpx.AsyncClient, rng: random.Random, kind: str, tally: Tally, probes: dict[str, str]
) -> None:
    chat = kind.startswith("chat")
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if kind == "bad request":
        body, param = rng.choice(BAD)
        r = await client.post("/v1/chat/completions" if "messages" in body else "/v1/completions", json=body)
        err = r.json().get("error", {}) if r.headers.get("content-type", "").startswith("application/json") else {}
        if r.status_code == 400 and err.get("message") and param in err["message"]:
            tally.outcomes["refused (intended)"] += 1
        else:
            tally.bad(f"bad request {body} answered {r.status_code}: {r.text[:200]}")
        return
    if kind == "greedy probe":
        prompt = rng.choice(PROBES)
        r = await client.post(
            "/v1/completions", json={"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        )
        got = r.json()["choices"][0]["text"] if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"
        if got == probes[prompt]:
            tally.outcomes["ok"] += 1
            tally.tokens += 24
        else:
            tally.bad(f"greedy probe {prompt!r} gave {got!r}, alone it gave {probes[prompt]!r}")
        return
    if kind.startswith("api fields"):
        chat, stream = rng.random() < 0.4, kind.endswith("stream")
        body = api_body(rng, chat, stream)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        if stream:
            async with client.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    tally.bad(f"{kind}: HTTP {r.status_code}")
                    return
                choices, used, error = await read_api_stream(r, chat)
        else:
            r = await client.post(path, json=body)
            if r.status_code != 200:
                tally.bad(f"{kind}: HTTP {r.status_code}: {r.text[:200]}")
                return
            choices, used, error = r.json()["choices"], r.json()["usage"]["completion_tokens"], None
        problem = error or check_api_answer(body, choices, used, chat)
        if problem:
            tally.bad(f"{kind} {json.dumps(body)[:300]}: {problem}")
        else:
            tally.outcomes["ok"] += 1
            tally.tokens += used or 0
        return
    if kind == "hang up mid-stream":
        body = {**make_body(rng, chat, True), "max_tokens": rng.randint(200, 1000)}
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                tally.bad(f"{kind}: HTTP {r.status_code}")
                return
            lines = rng.randint(0, 8)
            async for _ in r.aiter_lines():
                lines -= 1
                if lines < 0:
                    break
        tally.outcomes["hung up"] += 1
        return
    stream = kind.endswith("stream")
    body = make_body(rng, chat, stream)
    if stream:
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                tally.bad(f"{kind}: HTTP {r.status_code}")
                return
            text, reason, used, error = await read_stream(r, chat)
    else:
        try:
            if kind == "give up waiting":  # a long answer and a short patience
                body["max_tokens"] = rng.randint(300, 1000)
                r = await client.post(path, json=body, timeout=rng.uniform(0.05, 0.5))
            else:
                r = await client.post(path, json=body)
        except httpx.TimeoutException:
            if kind != "give up waiting":
                raise
            tally.outcomes["gave up"] += 1
            return
        if r.status_code != 200:
            tally.bad(f"{kind}: HTTP {r.status_code}: {r.text[:200]}")
            return
        j = r.json()
        choice = j["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        reason, used, error = choice["finish_reason"], j["usage"]["completion_tokens"], None
    problem = error or check_answer(body, text, reason, used)
    if problem:
        tally.bad(f"{kind}: {problem}")
    else:
        tally.outcomes["ok"] += 1
        tally.tokens += used or 0


async def client_loop(client: httpx.AsyncClient, seed: int, until: float, tally: Tally, probes: dict[str, str]) -> None:
    rng = random.Random(seed)
    mix = {k: w for k, w in KINDS.items() if probes or k != "greedy probe"}
    kinds, weights = list(mix), list(mix.values())
    while time.monotonic() < until:
        kind = rng.choices(kinds, weights)[0]
        tally.kinds[kind] += 1
        try:
            await one_request(client, rng, kind, tally, probes)
        except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
            tally.bad(f"{kind}: {type(e).__name__}: {e}")


async def load(
    client: httpx.AsyncClient, clients: int, seconds: float, seed: int, probes: dict[str, str], label: str, quiet: bool
) -> Tally:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    tally = Tally()
    until = time.monotonic() + seconds
    tasks = [asyncio.create_task(client_loop(client, seed * 1000 + i, until, tally, probes)) for i in range(clients)]
    with Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        transient=True,
        disable=quiet,
    ) as bar:
        task = bar.add_task(label, total=seconds, status="")
        while not all(t.done() for t in tasks):
            left = max(until - time.monotonic(), 0)
            bar.update(
                task,
                completed=seconds - left,
                status=f"{sum(tally.kinds.values())} requests, {tally.outcomes['unexpected']} unexpected",
            )
            await asyncio.sleep(0.5)
    for t in tasks:
        t.result()
    return tally


async def soak(args: argparse.Namespace, url: str, pid: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=args.clients * 2, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        probes = {}
        for p in PROBES if args.model is None else []:  # greedy answers on the idle server, to match under load
            # (only with the peaked model: a model of near-flat random weights may flip a near-tie under batching)
            r = await client.post(
                "/v1/completions", json={"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
            )
            probes[p] = r.json()["choices"][0]["text"]
        warm = await load(client, args.clients, args.warmup, args.seed + 1, probes, "warming up", args.quiet)
        warm_idle = await wait_idle(client)
        baseline = rss_mb(pid)
        rss = [baseline]

        async def sample_rss() -> None:
            while True:
                await asyncio.sleep(1.0)
                rss.append(rss_mb(pid))

        sampler = asyncio.create_task(sample_rss())
        t0 = time.monotonic()
        tally = await load(client, args.clients, args.duration, args.seed, probes, "soaking", args.quiet)
        elapsed = time.monotonic() - t0
        sampler.cancel()
        end = await wait_idle(client)
        end_rss = rss_mb(pid)
        health = (await client.get("/health")).status_code
    grew = {
        k: int(end.get(k, 0) - warm_idle.get(k, 0))
        for k in end
        if k.endswith("_total") or k.startswith("request_success_total")
    }
    pages = end["kv_cache_pages_free"] + end["kv_cache_pages_evictable"]
    checks = {
        "no unexpected errors (soak and warm-up)": tally.outcomes["unexpected"] + warm.outcomes["unexpected"] == 0,
        "requests completed": tally.outcomes["ok"] > 0,
        "idle at the end (running, waiting, in flight 0)": end["num_requests_running"]
        == end["num_requests_waiting"]
        == end["num_requests_in_flight"]
        == 0,
        "every KV page free or evictable": end["kv_cache_usage_perc"] == 0 and pages == args.num_pages,
        "/health 200": health == 200,
        f"RSS within {args.rss_slack_mb} MB of the warm baseline": end_rss - baseline <= args.rss_slack_mb,
    }
    return {
        "duration_s": elapsed,
        "clients": args.clients,
        "requests": sum(tally.kinds.values()),
        "by_kind": dict(tally.kinds),
        "outcomes": dict(tally.outcomes),
        "completed": tally.outcomes["ok"],
        "unexpected_errors": tally.outcomes["unexpected"] + warm.outcomes["unexpected"],
        "unexpected_examples": (warm.unexpected + tally.unexpected)[:20],
        "output_tokens": tally.tokens,
        "requests_per_s": sum(tally.kinds.values()) / elapsed,
        "output_tokens_per_s": tally.tokens / elapsed,
        "server_during_soak": grew,
        "preemptions": grew.get("num_preemptions_total", 0),
        "prefix_cache_hit_rate": grew.get("prefix_cache_hits_total", 0)
        / max(grew.get("prefix_cache_queries_total", 0), 1),
        "rss_mb": {"baseline": baseline, "peak": max(rss), "end": end_rss, "growth": end_rss - baseline},
        "kv_pages_end": {
            "total": args.num_pages,
            "free": int(end["kv_cache_pages_free"]),
            "evictable": int(end["kv_cache_pages_evictable"]),
            "in_use_fraction": end["kv_cache_usage_perc"],
        },
        "end_state": {
            k: int(end[k]) for k in ("num_requests_running", "num_requests_waiting", "num_requests_in_flight")
        },
        "health": health,
        "checks": checks,
        "warmup": {"seconds": args.warmup, "outcomes": dict(warm.outcomes)},
    }


def report(res: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"minisgl serve soak: {res['model']}", title_justify="left", show_header=False)
    t.add_column("", style="bold")
    t.add_column("", justify="right")
    rows: list[tuple[str, Any]] = [
        ("duration (s) / clients", f"{res['duration_s']:.0f} / {res['clients']}"),
        ("requests", res["requests"]),
        *((f"  {k}", v) for k, v in sorted(res["by_kind"].items())),
        *((f"outcome: {k}", v) for k, v in sorted(res["outcomes"].items())),
        ("unexpected errors (incl. warm-up)", res["unexpected_errors"]),
        ("output tokens / s", res["output_tokens_per_s"]),
        ("requests / s", res["requests_per_s"]),
        ("preemptions", res["preemptions"]),
        ("prefix cache hit rate", res["prefix_cache_hit_rate"]),
        *(
            (f"finished: {k.split('[')[1][:-1]}", v)
            for k, v in sorted(res["server_during_soak"].items())
            if k.startswith("request_success_total[")
        ),
        ("RSS MB baseline / peak / end", " / ".join(f"{res['rss_mb'][k]:.1f}" for k in ("baseline", "peak", "end"))),
        ("RSS growth MB", res["rss_mb"]["growth"]),
        (
            "KV pages free + evictable / total",
            f"{res['kv_pages_end']['free'] + res['kv_pages_end']['evictable']} / {res['kv_pages_end']['total']}",
        ),
        ("running / waiting / in flight", " / ".join(str(v) for v in res["end_state"].values())),
        ("/health", res["health"]),
        ("server exit code (Ctrl-C)", res["server_exit_code"]),
    ]
    for label, value in rows:
        t.add_row(label, fmt(value))
    for name, ok in res["checks"].items():
        t.add_row(name, "[green]pass[/green]" if ok else "[red]FAIL[/red]")
    console = Console()
    console.print(t)
    for why in res["unexpected_examples"]:
        console.print(f"unexpected: {why}", markup=False, style="red")
    if not res["passed"]:
        console.print(res["server_log_tail"], markup=False)
    console.print("[bold green]PASSED[/bold green]" if res["passed"] else "[bold red]FAILED[/bold red]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of load (after the warm-up)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of load before the RSS baseline")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients")
    ap.add_argument(
        "--model",
        default=None,
        help="served model (default: a tiny Llama with peaked weights; the greedy probes only run on that one)",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--num-pages", type=int, default=96, help="KV pool (small: waiting and preemption happen)")
    ap.add_argument("--max-running-requests", type=int, default=16)
    ap.add_argument("--rss-slack-mb", type=float, default=64.0, help="allowed RSS growth over the warm baseline")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args()
    if args.duration <= 0 or args.clients < 1 or args.warmup < 0:
        ap.error("--duration > 0, --clients >= 1 and --warmup >= 0, please")

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or peaked_model(Path(tmp))
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "minisgl_cli",
            "serve",
            "--model",
            model,
            "--device",
            args.device,
            "--num-pages",
            str(args.num_pages),
            "--max-running-requests",
            str(args.max_running_requests),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        log_path = Path(tmp) / "server.log"  # a file, not a pipe: a chatty server must never block on its output
        log = log_path.open("w")
        server = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 180
            while True:
                if server.poll() is not None:
                    sys.exit(f"the server exited ({server.returncode}):\n{log_path.read_text()[-5000:]}")
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    sys.exit("the server did not come up within 180 s")
                time.sleep(0.2)
            res = asyncio.run(soak(args, url, server.pid))
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGINT)
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
            log.close()
        res["server_exit_code"] = server.returncode
        res["server_log_tail"] = log_path.read_text()[-3000:]
        res["checks"]["server exits 0 on Ctrl-C"] = server.returncode == 0
        res["passed"] = all(res["checks"].values())
        res["model"] = args.model or "tiny-llama (peaked random weights)"
        res["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        res["environment"] = environment()
    report(res)
    if args.json is not None:
        write_json(args.json, res)
    sys.exit(0 if res["passed"] else 1)


if __name__ == "__main__":
    main()
