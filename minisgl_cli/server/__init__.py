"""The OpenAI-compatible HTTP server behind `minisgl serve`: a FastAPI app (this process) over an engine
running in another process (engine.engine_loop), reached through engine.remote_llm.RemoteLLM."""

from minisgl_cli.server.app import create_app

__all__ = ["create_app"]
