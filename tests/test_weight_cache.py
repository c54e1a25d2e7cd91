"""The dequantized GGUF model cached as a HF directory: the second load gives the same model and tokenizer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import weight_cache
from engine.loader import load_model
from engine.model_source import embedded_default_path
from tests.conftest import subprocess_env
from tests.test_cpu_ops import quantized_modules
from tests.test_hf_equivalence import PROMPTS


def test_second_load_comes_from_the_cache_and_matches(smollm, tmp_path, monkeypatch):
    monkeypatch.setenv("MINISGL_WEIGHT_CACHE", "1")
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path))
    gguf = embedded_default_path()
    assert weight_cache.lookup(gguf) is None
    first = load_model(None, torch.device("cpu"), torch.float32)  # reads the GGUF, writes the cache
    entry = weight_cache.lookup(gguf)
    assert entry is not None and entry.is_relative_to(tmp_path)
    second = load_model(None, torch.device("cpu"), torch.float32)
    assert second.source == first.source == f"gguf:{gguf}"
    assert second.cfg == first.cfg == smollm.engine.model_cfg
    ref = smollm.engine.runner.model.state_dict()
    for name, w in second.model.state_dict().items():
        assert torch.equal(w, ref[name]), name
    blocks, cached_blocks = quantized_modules(first.model), quantized_modules(second.model)
    assert blocks.keys() == cached_blocks.keys() and len(blocks) == 4 * first.cfg.num_layers + 1
    for name, q in blocks.items():
        c = cached_blocks[name]
        assert q.kind == c.kind and torch.equal(q.qs, c.qs) and torch.equal(q.d, c.d), name
        assert (q.m is None and c.m is None) or (q.m is not None and c.m is not None and torch.equal(q.m, c.m)), name
    assert second.tokenizer.eos_ids == smollm.tokenizer.eos_ids
    for p in PROMPTS:
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": p}]
        assert second.tokenizer.encode_chat(msgs) == smollm.tokenizer.encode_chat(msgs)
        ids = smollm.tokenizer.encode(p + " café 日本")
        assert second.tokenizer.decode(ids) == smollm.tokenizer.decode(ids)
    # The cached directory names transformers' generic fast tokenizer, which the engine loads directly; AutoTokenizer,
    # which reads the model's config first, gives the same object.
    from transformers import AutoTokenizer

    from engine.tokenizer import _generic_fast

    assert _generic_fast(entry)  # the direct path is the one taken
    auto, direct = AutoTokenizer.from_pretrained(str(entry)), second.tokenizer.hf
    assert type(direct) is type(auto) and direct.backend_tokenizer.to_str() == auto.backend_tokenizer.to_str()
    assert direct.special_tokens_map == auto.special_tokens_map and direct.chat_template == auto.chat_template
    for p in PROMPTS:
        msgs = [{"role": "user", "content": p}]
        assert direct.apply_chat_template(msgs, tokenize=False) == auto.apply_chat_template(msgs, tokenize=False)
        assert direct.encode(p) == auto.encode(p) and direct.decode(auto.encode(p)) == auto.decode(auto.encode(p))


def test_key_follows_content_not_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "c"))
    f, g = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for p, byte in ((f, b"x"), (g, b"y")):
        p.parent.mkdir()
        p.write_bytes(byte * 3_000_000)
        os.utime(p, ns=(1, 1))  # one name, size and mtime (cp -p, tar x): different files, different entries
    assert weight_cache.entry(f) != weight_cache.entry(g) and weight_cache.entry(f).name == "m"
    a = weight_cache.entry(f)
    os.utime(f, ns=(2, 2))  # the same file installed again (another machine, another venv): its own entry
    assert weight_cache.entry(f) == a
    h = tmp_path / "c" / f"gguf-v{weight_cache.FORMAT}" / weight_cache.HASHES
    assert [p.read_text() for p in h.iterdir()].count(a.parent.name) == 2  # remembered for both stats of f


def test_ctrl_c_while_the_hash_is_remembered_leaves_no_staging_file(tmp_path, monkeypatch):
    """A Ctrl-C landing between the memo's staging write and its rename (a command's model load interrupted) left
    `.<memo>.<pid>.tmp` in the cache for good."""
    from tests.at_line import at_line

    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "c"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 100_000)

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    with at_line(weight_cache.fingerprint, "tmp.replace(memo)", ctrl_c) as hit, pytest.raises(KeyboardInterrupt):
        weight_cache.fingerprint(f)
    assert hit
    assert [p.name for p in (tmp_path / "c").rglob("*") if p.is_file()] == []
    key = weight_cache.fingerprint(f)  # the next start hashes it again and remembers it
    assert [p.read_text() for p in (tmp_path / "c").rglob("*") if p.is_file()] == [key]


def test_key_covers_every_byte_and_an_edit_in_place(tmp_path, monkeypatch):
    """A file edited in place, one byte past its first MiB between any two 64 KiB samples of the old key, its mtime
    put back (`touch -r`, a tool that keeps it): another entry, not the stale one, and not the hash remembered for
    the file as it was."""
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "c"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 8_000_000)
    os.utime(f, ns=(1, 1))
    before = weight_cache.entry(f)
    assert weight_cache.entry(f) == before  # from the memo
    with f.open("r+b") as w:
        w.seek(1_200_000)  # between the old samples at 1,125,000 + 64 KiB and 1,250,000
        w.write(b"y")
    os.utime(f, ns=(1, 1))
    assert weight_cache.entry(f) != before


def test_unwritable_cache_warns_and_carries_on(smollm, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MINISGL_WEIGHT_CACHE", "1")
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(blocker))
    gguf = embedded_default_path()
    assert weight_cache.store(gguf, smollm.engine.model_cfg, {"w": torch.zeros(2)}, None, {}) is None
    assert "cannot cache the dequantized weights" in capsys.readouterr().err
    assert weight_cache.lookup(gguf) is None
    monkeypatch.setenv("MINISGL_WEIGHT_CACHE", "0")
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "off"))
    assert weight_cache.store(gguf, smollm.engine.model_cfg, {"w": torch.zeros(2)}, None, {}) is None
    assert not (tmp_path / "off").exists()


def test_an_entry_without_quantized_blocks_reads_back(tmp_path, monkeypatch):
    """A GGUF whose tensors are all F16/F32 has no blocks for the CPU kernel: its entry still loads."""
    from engine.model_config import PRESETS

    monkeypatch.setenv("MINISGL_WEIGHT_CACHE", "1")
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "c"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 10)
    entry = weight_cache.store(f, PRESETS["tiny-llama"], {"w": torch.zeros(2)}, None, {})
    assert entry is not None and weight_cache.lookup(f) == entry
    assert weight_cache.load_quantized(entry) == {}


def test_a_killed_stores_staging_folder_goes_once_the_entry_is_there(tmp_path, monkeypatch):
    """A store killed (the OOM killer) while another process completed the entry left its staging folder, hundreds
    of MB, for good: only a later store swept such folders, and with the entry in place no store comes."""
    from engine.model_config import PRESETS

    monkeypatch.setenv("MINISGL_WEIGHT_CACHE", "1")
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "c"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 10)
    entry = weight_cache.store(f, PRESETS["tiny-llama"], {"w": torch.zeros(2)}, None, {})
    assert entry is not None
    dead = subprocess.Popen(["true"])
    dead.wait()
    staging = entry.parent / f".{entry.name}.{dead.pid}.tmp"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"\0" * 1000)
    assert weight_cache.lookup(f) == entry and not staging.exists()


def test_a_full_disk_under_the_cache_warns_and_carries_on(tmp_path):
    """safetensors reports a write that the disk refuses (ENOSPC; here EFBIG, a file-size limit, as real an I/O
    error) as its own SafetensorError, not an OSError: the first start on a nearly full disk ended in a traceback
    instead of the warning an unwritable cache costs."""
    script = f"""
import resource, signal, sys, torch
from pathlib import Path
from engine import weight_cache
from engine.model_config import PRESETS
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
f = Path({str(tmp_path / "m.gguf")!r}); f.write_bytes(b"x" * 10)
weight_cache.entry(f)  # its content hash remembered before the limit
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
entry = weight_cache.store(f, PRESETS["tiny-llama"], {{"w": torch.zeros(1 << 20)}}, None, {{}})
print("entry", entry)
"""
    env = subprocess_env(MINISGL_WEIGHT_CACHE="1", MINISGL_CACHE_DIR=str(tmp_path / "c"))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0 and "entry None" in p.stdout, p.stderr[-3000:]
    assert "cannot cache the dequantized weights" in p.stderr and "File too large" in p.stderr, p.stderr
    assert not list((tmp_path / "c").rglob("*.tmp")), list((tmp_path / "c").rglob("*"))


def _damage(entry, how: str) -> None:
    if how == "weights cut short":
        f = entry / "model.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif how == "config.json removed":
        (entry / "config.json").unlink()
    elif how == "tokenizer file removed":
        (entry / "tokenizer.json").unlink()
    elif how == "manifest missing":
        (entry / weight_cache.MANIFEST).unlink()
    else:  # same size, not a safetensors header any more
        f = entry / "model.safetensors"
        f.write_bytes(b"\xff" * f.stat().st_size)


@pytest.mark.parametrize(
    "how", ["weights cut short", "config.json removed", "tokenizer file removed", "manifest missing", "garbled header"]
)
def test_a_damaged_entry_is_removed_and_the_gguf_read_again(how, tmp_path, monkeypatch, capfd):
    """A cache entry damaged after it was written used to fail every start (`cannot read .../model.safetensors`),
    or load without its tokenizer (text through bytes): now it is removed, with a warning, and the GGUF is read."""
    from engine.model_config import PRESETS
    from engine.weights import dummy_weights
    from tests.test_bad_input import _tiny_gguf

    monkeypatch.setenv("MINISGL_WEIGHT_CACHE", "1")
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "c"))
    f = tmp_path / "m.gguf"
    _tiny_gguf(f)
    cfg = PRESETS["tiny-llama"]
    weights = dict(dummy_weights(cfg, "cpu", torch.float32))

    class Tok:  # what store() asks of a tokenizer
        def save_pretrained(self, d: str) -> None:
            (Path(d) / "tokenizer.json").write_text("{}")

    entry = weight_cache.store(f, cfg, weights, Tok(), {})
    assert entry is not None and weight_cache.lookup(f) == entry
    capfd.readouterr()
    _damage(entry, how)
    loaded = load_model(str(f), torch.device("cpu"), torch.float32, with_tokenizer=False)
    assert "is damaged" in capfd.readouterr().err
    assert not entry.exists()
    assert loaded.cfg.num_layers == 1  # the GGUF's own config (the entry held tiny-llama's two layers)


def test_front_ends_load_the_cached_tokenizer_without_torch(smollm):
    """The chat's and the server's front-end processes need only the tokenizer: with the cache filled (the smollm
    fixture's load), theirs comes without importing torch (~1.8 s of a 2-core machine's start) and encodes as the
    engine's does."""
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    text = "Hello, café 日本"
    code = (
        "import sys\n"
        "import minisgl_cli.server.frontend, minisgl_cli.tui.frontend, minisgl_cli.tui.app, minisgl_cli.tui.plain\n"
        "from engine.tokenizer import load_tokenizer\n"
        f"print(load_tokenizer(None).encode({text!r}))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    ids, torch_modules = r.stdout.splitlines()
    assert ids == str(smollm.tokenizer.encode(text)) and torch_modules == "[]"
