"""engine/gguf_file.py reads what gguf-py's own reader reads: every metadata value and every tensor's data, on the
embedded model and on a file holding every value type, several tensor types and a non-default alignment."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.gguf_file import read_gguf
from engine.model_source import embedded_default_path
from engine.weights import open_gguf


def assert_reads_as_gguf_py(path: Path) -> None:
    ours, ref = read_gguf(path), gguf.GGUFReader(str(path))
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]  # gguf-py's own entries for the header
    assert list(ours.fields) == keys
    for k in keys:
        assert ours.fields[k] == ref.fields[k].contents(), k
        assert type(ours.fields[k]) is type(ref.fields[k].contents()), k
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors):
        assert (a.tensor_type, a.shape) == (b.tensor_type, tuple(b.shape.tolist())), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data, equal_nan=True), a.name
        if a.tensor_type.name != "I32":  # gguf.dequantize takes floats and quantized blocks
            assert np.array_equal(gguf.dequantize(a.data, a.tensor_type), gguf.dequantize(b.data, b.tensor_type))


def test_the_embedded_model_reads_as_gguf_py_reads_it():
    assert_reads_as_gguf_py(embedded_default_path())


def test_every_value_type_and_several_tensor_types(tmp_path):
    path = tmp_path / "all.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_string("t.empty", "")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.strs", ["a", "", "ü"])
    w.add_array("t.bools", [True, False])
    w.add_array("t.none", [])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((4, 8)).astype(np.float16))
    w.add_tensor("i32", np.arange(7, dtype=np.int32))
    for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.BF16):
        x = rng.standard_normal((2, 64)).astype(np.float32)
        w.add_tensor(qtype.name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_reads_as_gguf_py(path)
    f = read_gguf(path)
    assert f.fields["t.str"] == "héllo ✓" and f.fields["t.u64"] == 2**63 + 5 and f.fields["t.strs"] == ["a", "", "ü"]


@pytest.mark.parametrize("cut", [3, 30, 200, -1])
def test_a_file_cut_short_is_refused_by_name(tmp_path, cut):
    """Cut in the magic, the header, the metadata, or the last tensor's data: a ValueError naming the file."""
    data = embedded_default_path().read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:cut])
    with pytest.raises(ValueError, match="cut.gguf is not a readable GGUF file"):
        open_gguf(path)


@pytest.mark.parametrize("kind, align", [("uint32", 0), ("int32", -32), ("float32", 32.0)])
def test_a_bad_alignment_is_refused_by_name(tmp_path, kind, align):
    """general.alignment 0 raised a bare ZeroDivisionError; a negative one read every tensor from the wrong offset
    (zeros here) without a word. gguf-py's reader takes a uint32 only."""
    path = tmp_path / "align.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    getattr(w, f"add_{kind}")("general.alignment", align)
    w.add_tensor("w", np.arange(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="align.gguf is not a readable GGUF file: general.alignment must be"):
        open_gguf(path)
