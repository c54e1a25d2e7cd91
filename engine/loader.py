"""Loading a model spec (as --model: a GGUF file, a HF directory, dummy:<preset>): its weights into a model on a
device, and its tokenizer alone. The model's own modules are imported when a model is built, so a front-end process
that needs only the tokenizer does not import them."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine import model_source, weight_cache, weights
from engine.cache_paths import cache_root
from engine.distributed import TP, refused_on_every_rank
from engine.model_config import ModelConfig
from engine.tokenizer import ByteTokenizer, Tokenizer, tokenizer_at

if TYPE_CHECKING:
    from engine.models.llama import LlamaForCausalLM
    from kernels.cpu_ops import QuantMatrix

Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass(slots=True)
class LoadedModel:
    cfg: ModelConfig
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    source: str
    load_seconds: float
    cpu_ops: bool = False  # layers run through kernels/cpu_ops (GGUF blocks, fused small ops, decode attention)


def device_memory(device: torch.device) -> int:
    """Bytes of memory the device has in all (the machine's RAM for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(cfg: ModelConfig, source: str, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse a config whose model cannot fit the device at all, before building it: otherwise the allocator fails
    inside some layer with a byte count that names neither the file nor the field (an intermediate_size of 1e11)."""
    params = cfg.param_count()
    rope_table = cfg.max_position_embeddings * cfg.head_dim * 4  # fp32 cos | sin per position
    need, have = (params * dtype.itemsize + rope_table) // TP.size, device_memory(device)
    if need > have:
        raise ValueError(
            f"{source}: its config describes {params:,} parameters ({params * dtype.itemsize / 2**30:,.1f} GiB in "
            f"{str(dtype).removeprefix('torch.')}) and a rope table of {cfg.max_position_embeddings:,} positions "
            f"({rope_table / 2**30:,.1f} GiB): more than the {have / 2**30:,.1f} GiB of this {device.type} device "
            "(check hidden_size, intermediate_size, vocab_size, num_hidden_layers and max_position_embeddings)"
        )


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def load_model(
    spec: str | None,
    device: torch.device,
    dtype: torch.dtype,
    progress: Progress | None = None,
    with_tokenizer: bool = True,
) -> LoadedModel:
    from engine.layers import cpu_weight_layout, use_cpu_ops
    from engine.models import create_model
    from kernels import cpu_ops

    t0 = time.perf_counter()
    kind, where = model_source.resolve(spec)
    source = f"{kind}:{where}"
    cached = weight_cache.lookup(Path(where)) if kind == "gguf" else None
    if cached is not None:
        kind, where = "hf", cached
    path = Path(where)  # a file or directory unless kind is "dummy"
    keep: dict[str, torch.Tensor] | None = {} if kind == "gguf" and with_tokenizer and weight_cache.enabled() else None
    # The C kernels (kernels/cpu_ops.py) compute in fp32, on one process: every op of a decode step, the linears from
    # a GGUF's blocks or from dense weights
    c_kernels = device.type == "cpu" and dtype == torch.float32 and TP.size == 1
    uses_cpu_ops = False
    quantized: dict[str, QuantMatrix] | None = {} if kind == "gguf" and (c_kernels or keep is not None) else None
    reader = weights.open_gguf(path) if kind == "gguf" else None
    cfg = weights.model_config(kind, where, reader)
    named = str(where) if kind != "dummy" else source
    try:
        cfg.check_splits(TP.size)
    except ValueError as e:
        raise refused_on_every_rank(ValueError(f"{named}: {e}")) from None
    check_fits(cfg, named, device, dtype)
    with torch.device(device), _default_dtype(dtype):
        model = create_model(cfg)
    with torch.no_grad():
        if kind == "dummy":
            model.load_weights(weights.dummy_weights(cfg, device, dtype), check_finite=False)  # drawn finite
        elif kind == "gguf":
            total = weights.gguf_tensor_count(path, reader)
            done = [0]

            def tick() -> None:
                done[0] += 1
                if progress:
                    progress("loading weights", done[0], total)

            stream = weights.gguf_weights(path, cfg, reader, tick, quantized)
            if keep is not None:  # the dequantized weights, for the cache
                stream = ((name, keep.setdefault(name, w)) for name, w in stream)
            try:
                model.load_weights(stream)
            except ValueError as e:  # a missing or wrongly shaped tensor did not name the file
                if str(path) in str(e):
                    raise
                raise ValueError(f"{path}: {e}") from e
        else:
            try:
                model.load_weights(weights.hf_weights(path))
            except ValueError as e:
                if str(where) in str(e):  # already names the file
                    raise
                raise ValueError(f"{where}: {e}") from e
    model.eval()
    if device.type == "cpu":
        cpu_weight_layout(model)
    else:
        with torch.no_grad():
            model.fold_norms()  # its own copies: the weight cache (below) stores the tensors as read
    if c_kernels and cached is not None:
        quantized = weight_cache.load_quantized(cached)
    if c_kernels and quantized:
        if (why := cpu_ops.load(cache_root() / "kernels")) is None:
            model.load_quantized(quantized)
            use_cpu_ops(model)
            uses_cpu_ops = True
        else:
            print(f"minisgl: no quantized CPU kernel ({why}); running the dequantized weights", file=sys.stderr)
    elif c_kernels and cpu_ops.load(cache_root() / "kernels") is None:
        # dense weights (without a compiler every op stays torch's, as it always was for them: nothing to say)
        use_cpu_ops(model)
        uses_cpu_ops = True
    tok = tokenizer_at(kind, path, cfg.eos_token_ids) if with_tokenizer else ByteTokenizer()
    if outside := sorted(t for t in tok.eos_ids if t >= cfg.vocab_size):  # config.json's were checked already
        raise ValueError(
            f"{where}: eos id {outside[0]} (of generation_config.json or the tokenizer) is outside the vocabulary "
            f"(vocab_size {cfg.vocab_size}: ids 0 to {cfg.vocab_size - 1})"
        )
    if keep is not None:
        weight_cache.store(path, cfg, keep, tok.hf, quantized or {})
    return LoadedModel(cfg, model, tok, source, time.perf_counter() - t0, uses_cpu_ops)
