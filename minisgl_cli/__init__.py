"""minisgl's command line, benchmarks and OpenAI-compatible server, over the engine (engine/)."""

from __future__ import annotations


def version() -> str:
    """The installed package's version, or the checkout's (run from a checkout on PYTHONPATH, not installed: the GPU
    machine), marked as such."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("minisgl")
    except PackageNotFoundError:
        import tomllib
        from pathlib import Path

        root = Path(__file__).parent.parent
        return f"{tomllib.loads((root / 'pyproject.toml').read_text())['project']['version']} (not installed: {root})"
