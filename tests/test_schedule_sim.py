"""benchmarks/schedule_sim.py: issue #15's replay through the engine's scheduler and KV cache on a simulated clock.
Step logs drawn from a known law give that law back, and a short trace replays to the end in each mode: every request
gets all its tokens, the pages all come back (the script checks), and a time-bound mode shows in the figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# seconds: per step, per token of context (detailed: of the decode rows'), per prefill token (and per prefill pair)
LAWS = {"decode": (2e-3, 1.7e-8, 0.0), "mixed": (3e-3, 1.5e-8, 6e-6), "prefill": (4e-3, 0.0, 3e-6)}
PAIRS = {"decode": 0.0, "mixed": 2e-9, "prefill": 1e-9}


def write_log(path: Path, detailed: bool) -> None:
    """Steps back to back, each kind's gap from its law (no noise); a detailed log also has the decode rows' context
    and the prefill rows' query-key pairs, as the engine's step log has had since the twenty-fifth session."""
    t, lines = 0.0, []
    for i in range(60):
        kind = ("decode", "mixed", "prefill")[i % 3]
        decode_rows, prefill_rows = {"decode": (9, 0), "mixed": (9, 2), "prefill": (0, 3)}[kind]
        context, prefill = 1000 * (i + 1) + 37 * i * i, (0 if kind == "decode" else 50 * i + 7)
        decode_context, pairs = (0 if kind == "prefill" else context - 3 * prefill), prefill * (i % 7) * 40
        a, b, c = LAWS[kind]
        t += a + b * (decode_context if detailed else context) + c * prefill + (PAIRS[kind] * pairs if detailed else 0)
        row = dict(
            t=t, decode_rows=decode_rows, prefill_rows=prefill_rows, prefill_tokens=prefill, context_tokens=context
        )
        if detailed:
            row.update(decode_context_tokens=decode_context, prefill_key_pairs=pairs)
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("detailed", [False, True])
def test_the_simulated_replay_runs_every_request_to_its_end(tmp_path: Path, detailed: bool) -> None:
    log, out = tmp_path / "steps.jsonl", tmp_path / "sim.json"
    write_log(log, detailed)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "schedule_sim.py"), str(log), "--trace"]
    cmd += [str(ROOT / "traces" / "qwen_sample.jsonl"), "--modes", "nomixed,mixed,mp16,cap2", "--json", str(out)]
    subprocess.run([*cmd, "--time-scale", "0.05", "--pool-tokens", "65536"], check=True, capture_output=True)
    res = json.loads(out.read_text())
    for kind, law in LAWS.items():
        got, want = res["laws"][kind]["coef"], [*law, PAIRS[kind]] if detailed else law
        assert got == pytest.approx(want, abs=1e-12) and res["laws"][kind]["residual_p99"] < 1e-9
    runs = {r["mode"]: r for r in res["runs"]}
    assert set(runs) == {"nomixed", "mixed", "mp16", "cap2"}
    for r in runs.values():
        assert r["completed"] == 64 and r["failed"] == 0
        assert r["total_output_tokens"] == r["expected_output_tokens"] > 0
        assert r["median_ttft_ms"] > 0 and r["median_itl_ms"] > 0
    # 16 prefill tokens a step beside decoding: prompts take many more steps, so they wait longer for a first token
    assert runs["mp16"]["engine_steps"] > runs["mixed"]["engine_steps"]
    assert runs["mp16"]["mean_ttft_ms"] > runs["mixed"]["mean_ttft_ms"]
