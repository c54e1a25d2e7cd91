"""The OpenAI-compatible HTTP server behind `minisgl serve`: a FastAPI app over one in-process AsyncLLM."""

from minisgl_cli.server.app import create_app

__all__ = ["create_app"]
