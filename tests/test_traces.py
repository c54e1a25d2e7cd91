"""Trace reading (Qwen/Bailian and Mooncake formats), bad lines, prompt synthesis, the shipped samples."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from minisgl_cli.trace_gen import write_samples
from minisgl_cli.trace_reader import PromptSynth, TraceError, read_trace

TRACES = Path(__file__).resolve().parent.parent / "traces"
SHARED_TRACE = Path("/work/shared/traces/conversation_trace.jsonl")


def write(tmp_path: Path, lines: list[str | dict], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return p


def qwen(ts: float, n: int = 40, out: int = 5, hashes=(1, 2, 3), chat: int = 0) -> dict:
    return {
        "chat_id": chat,
        "parent_chat_id": -1,
        "timestamp": ts,
        "input_length": n,
        "output_length": out,
        "type": "text",
        "turn": 1,
        "hash_ids": list(hashes),
    }


def mooncake(ts: int, n: int = 1000, out: int = 5, hashes=(0, 1)) -> dict:
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": list(hashes)}


def test_qwen_format_detected_in_seconds_with_16_token_blocks(tmp_path):
    t = read_trace(write(tmp_path, [qwen(0.5, chat=7), qwen(1.25, chat=8)]))
    assert (t.format, t.block_size) == ("qwen", 16)
    assert [r.timestamp for r in t.requests] == [0.5, 1.25]
    r = t.requests[0]
    assert (r.chat_id, r.parent_chat_id, r.turn, r.type, r.line) == (7, -1, 1, "text", 1)
    assert (r.input_length, r.output_length, r.hash_ids) == (40, 5, (1, 2, 3))


def test_mooncake_format_detected_in_milliseconds_with_512_token_blocks(tmp_path):
    t = read_trace(write(tmp_path, [mooncake(0), mooncake(1500)]))
    assert (t.format, t.block_size) == ("mooncake", 512)
    assert [r.timestamp for r in t.requests] == [0.0, 1.5]
    assert t.requests[1].chat_id is None


def test_format_and_block_size_overrides(tmp_path):
    # A Mooncake-shaped file read as Qwen: timestamps become seconds, blocks 16 tokens; --block-size wins.
    t = read_trace(write(tmp_path, [mooncake(0), mooncake(2)]), fmt="qwen", block_size=64)
    assert (t.format, t.block_size, t.requests[1].timestamp) == ("qwen", 64, 2.0)
    with pytest.raises(TraceError, match="unknown trace format"):
        read_trace(write(tmp_path, [mooncake(0)]), fmt="bailian")


@pytest.mark.parametrize(
    "bad, why",
    [
        ('{"timestamp": 1, "input_length": 10', "invalid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        (json.dumps({"timestamp": 2, "output_length": 5, "hash_ids": [1]}), "missing field 'input_length'"),
        (json.dumps({"timestamp": 2, "input_length": 5, "output_length": 5}), "missing field 'hash_ids'"),
        (json.dumps({"input_length": 5, "output_length": 5, "hash_ids": [1]}), "missing field 'timestamp'"),
        (json.dumps(mooncake(2, n=-3)), "'input_length' must be >= 1"),
        (json.dumps(mooncake(2, out=-1)), "'output_length' must be >= 1"),
        (json.dumps(mooncake(2, out=0)), "'output_length' must be >= 1"),
        (json.dumps({**mooncake(2), "input_length": "12"}), "'input_length' must be an integer"),
        (json.dumps({**mooncake(2), "hash_ids": [1, "x"]}), "'hash_ids' must be a list of integers"),
        (json.dumps(mooncake(-5)), "'timestamp' must be a finite number >= 0"),
        (json.dumps(mooncake(0)), "timestamp goes back in time"),  # after a request at 1 ms
    ],
)
def test_bad_line_names_file_line_and_problem(tmp_path, bad, why):
    path = write(tmp_path, [mooncake(0), mooncake(1), bad, mooncake(3)])
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert f"{path}:3:" in str(err.value) and why in str(err.value)


def test_skip_bad_lines_counts_them_and_keeps_the_rest(tmp_path):
    lines = [qwen(0.0), "not json", qwen(1.0, n=-1), qwen(2.0), qwen(1.5), "", qwen(3.0)]
    t = read_trace(write(tmp_path, lines), skip_bad_lines=True)
    assert [r.line for r in t.requests] == [1, 4, 7]
    assert [r.index for r in t.requests] == [0, 1, 2]
    assert [line for line, _ in t.skipped] == [2, 3, 5]
    assert "goes back in time" in t.skipped[2][1]


def test_unreadable_or_empty_trace(tmp_path):
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "missing.jsonl")
    with pytest.raises(TraceError, match="no usable requests"):
        read_trace(write(tmp_path, ["oops"]), skip_bad_lines=True)


def test_binary_or_gzip_trace_names_the_line_or_says_what_it_is(tmp_path):
    """A stray non-UTF-8 byte was reported for the whole file ('utf-8 codec can't decode byte 0xff in position
    2,500,000', no line, and --skip-bad-lines could not skip it); a gzip-compressed trace the same way."""
    path = tmp_path / "t.jsonl"
    good = json.dumps(mooncake(0)).encode() + b"\n"
    path.write_bytes(good + b'{"timestamp": 1, "x": "\xff"}\n' + good.replace(b": 0,", b": 2,"))
    with pytest.raises(TraceError, match=rf"{path}:2: not UTF-8 text \(byte 0xff at column 24\)"):
        read_trace(path)
    t = read_trace(path, skip_bad_lines=True)
    assert [r.line for r in t.requests] == [1, 3] and t.skipped[0][0] == 2
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(good))
    with pytest.raises(TraceError, match=r"is gzip-compressed: decompress it first \(gunzip -k"):
        read_trace(gz)
    with pytest.raises(TraceError, match="cannot read trace .*Is a directory"):
        read_trace(tmp_path)


def test_a_byte_order_mark_is_read_past(tmp_path):
    """A trace saved by a Windows tool starts with UTF-8's byte-order mark: its first line was refused ('Unexpected
    UTF-8 BOM'). A mark anywhere else is still a bad line."""
    p = write(tmp_path, [qwen(0.0), qwen(1.0)])
    p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
    assert len(read_trace(p).requests) == 2
    p.write_bytes(p.read_bytes().replace(b"\n{", b"\n\xef\xbb\xbf{", 1))
    with pytest.raises(TraceError, match=":2: invalid JSON"):
        read_trace(p)


def test_window_rebases_time_and_slices(tmp_path):
    t = read_trace(write(tmp_path, [mooncake(i * 1000) for i in range(10)]))
    w = t.window(start=3, num_requests=4)
    assert [r.index for r in w.requests] == [3, 4, 5, 6]
    assert [r.timestamp for r in w.requests] == [0.0, 1.0, 2.0, 3.0]


def test_reuse_upper_bound_counts_repeated_block_tokens(tmp_path):
    # Block size 16. A: 40 tokens in blocks 1,2,3 (16+16+8). B repeats 1,2 (32 tokens) then a new block.
    # C repeats 1 and 3; block 3 was seen with only 8 tokens, so C's full block 3 can reuse only 8 of its 16.
    lines = [qwen(0, 40, hashes=(1, 2, 3)), qwen(1, 48, hashes=(1, 2, 4)), qwen(2, 32, hashes=(1, 3))]
    t = read_trace(write(tmp_path, lines))
    assert t.reuse_upper_bound() == pytest.approx((0 + 32 + 16 + 8) / (40 + 48 + 32))
    # over B and C alone (A cut off after it had filled the cache): A's blocks are still there to be reused
    assert t.reuse_upper_bound(over={1, 2}) == pytest.approx((32 + 16 + 8) / (48 + 32))
    assert t.reuse_upper_bound(over={0}) == 0.0 and t.reuse_upper_bound(over=set()) is None


def test_prompt_synthesis_follows_hash_ids():
    synth = PromptSynth(vocab_size=300, block_size=16, seed=0)
    a = synth.prompt((1, 2, 3), 40, unique_key=0)
    b = synth.prompt((1, 2, 4), 48, unique_key=1)
    c = synth.prompt((1,), 50, unique_key=2)  # only 16 tokens covered by hash ids: the rest is its own
    d = synth.prompt((1,), 50, unique_key=3)
    assert (len(a), len(b), len(c)) == (40, 48, 50)
    assert a[:32] == b[:32] and a[32:40] != b[32:40]
    assert c[:16] == a[:16] and c[16:] != d[16:]
    assert all(0 <= t < 300 for t in a + b + c + d)
    assert PromptSynth(300, 16, seed=0).prompt((1, 2, 3), 40, 0) == a  # deterministic
    assert PromptSynth(300, 16, seed=1).prompt((1, 2, 3), 40, 0) != a
    big = PromptSynth(300, 16).prompt((2**63 + 5, -7), 20, 0)  # salted 64-bit hashes, negative ids
    assert len(big) == 20


def test_shipped_samples_are_the_generators_output(tmp_path):
    for made in write_samples(tmp_path):
        assert made.read_bytes() == (TRACES / made.name).read_bytes(), made.name


@pytest.mark.parametrize(
    "name, fmt, block",
    [
        ("qwen_sample.jsonl", "qwen", 16),
        ("mooncake_sample.jsonl", "mooncake", 512),
        ("mooncake_conversation_head200.jsonl", "mooncake", 512),
    ],
)
def test_shipped_samples_parse_with_prefix_sharing(name, fmt, block):
    t = read_trace(TRACES / name)
    assert (t.format, t.block_size, t.skipped) == (fmt, block, [])
    assert all(len(r.hash_ids) == -(-r.input_length // block) for r in t.requests)
    assert t.reuse_upper_bound() > 0.05


def test_mooncake_slice_is_the_head_of_the_published_trace():
    if not SHARED_TRACE.exists():
        pytest.skip("the shared Mooncake trace is not on this machine")
    head = SHARED_TRACE.read_text().splitlines(keepends=True)[:200]
    assert (TRACES / "mooncake_conversation_head200.jsonl").read_text() == "".join(head)
    full = read_trace(SHARED_TRACE)
    assert len(full.requests) == 12031 and full.requests[-1].timestamp == pytest.approx(3536.999)
    # SOURCES.md: 0.366 of block occurrences repeat an earlier block; weighting by tokens gives a bit more.
    assert 0.366 <= full.reuse_upper_bound() < 0.38
