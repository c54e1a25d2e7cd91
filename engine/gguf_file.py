"""A GGUF file's metadata and tensors, read directly (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).

gguf-py's GGUFReader makes a numpy view of every item of every metadata array: ~6 s of each cold load of the embedded
model on a 2-core machine, nearly all of it its 49,152-token vocabulary and 48,900 merges, which the engine never
reads (the tokenizer is built by transformers from the file). This reads the same header with `struct` in a fraction
of a second and maps each tensor's data as GGUFReader does, so `gguf.dequantize` takes it unchanged."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# GGUF value types -> struct formats (little-endian); 8 is a string, 9 an array
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
# tensor types whose data GGUFReader maps as numbers (the others as raw bytes, blocks per row)
_PLAIN = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16, "I32": np.int32}
_PLAIN["I64"] = np.int64


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF's order, innermost dimension first
    data: np.ndarray  # read-only map of the file: numbers, or a quantized type's bytes


@dataclass(frozen=True, slots=True)
class GGUFFile:
    fields: dict[str, Any]  # scalars as Python values, strings as str, arrays as lists
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.at = buf, 0

    def take(self, fmt: str) -> Any:
        (v,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if self.at + n > len(self.buf):
            raise struct.error(f"a string of {n:,} bytes runs past the end of the file")
        s = bytes(self.buf[self.at : self.at + n]).decode("utf-8", errors="replace")
        self.at += n
        return s

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.take("<I"), self.take("<Q")
            if etype in _NUMPY:
                dt = np.dtype(_NUMPY[etype])
                if self.at + count * dt.itemsize > len(self.buf):
                    raise struct.error(f"an array of {count:,} items runs past the end of the file")
                items = np.frombuffer(self.buf, dt, count, self.at).tolist()
                self.at += count * dt.itemsize
                return items
            return [self.value(etype) for _ in range(count)]
        if vtype not in _SCALAR:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.take(_SCALAR[vtype])


def read_gguf(path: Path) -> GGUFFile:
    """The file's metadata and tensors. ValueError (or struct.error, OSError) for a file that is not GGUF, is cut
    short, or names a tensor twice or past its end."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    mm = np.memmap(path, dtype=np.uint8, mode="r")
    buf = mm.data  # a memoryview of the map
    c = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("no GGUF magic at its start")
    version = c.take("<4x I")
    if version not in (2, 3):  # also a big-endian file, whose version reads byte-swapped here
        raise ValueError(f"GGUF version {version} is not supported (2 and 3 are, little-endian)")
    n_tensors, n_fields = c.take("<Q"), c.take("<Q")
    fields: dict[str, Any] = {}
    for _ in range(n_fields):
        key = c.string()
        fields[key] = c.value(c.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = tuple(c.take("<Q") for _ in range(c.take("<I")))
        infos.append((name, dims, GGMLQuantizationType(c.take("<I")), c.take("<Q")))
    align = fields.get("general.alignment", 32)
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0:  # 0 divided by zero; < 0 read elsewhere
        raise ValueError(f"general.alignment must be a positive integer (got {align!r})")
    start = -(-c.at // align) * align
    tensors, seen = [], set()
    for name, dims, qtype, offset in infos:
        if name in seen:
            raise ValueError(f"tensor {name!r} is named twice")
        seen.add(name)
        n = int(np.prod(dims, dtype=np.int64))
        block, size = GGML_QUANT_SIZES[qtype]
        n_bytes, at = n * size // block, start + offset
        if at + n_bytes > len(mm):
            raise ValueError(f"tensor {name!r} runs past the end of the file ({at + n_bytes:,} > {len(mm):,} bytes)")
        np_dims = tuple(reversed(dims))
        if qtype.name in _PLAIN:
            data = mm[at : at + n_bytes].view(_PLAIN[qtype.name]).reshape(np_dims)
        else:
            data = mm[at : at + n_bytes].reshape(quant_shape_to_byte_shape(np_dims, qtype))
        tensors.append(GGUFTensor(name, qtype, dims, data))
    return GGUFFile(fields, tensors)
