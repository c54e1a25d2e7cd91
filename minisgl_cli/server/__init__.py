"""The OpenAI-compatible HTTP server behind `minisgl serve`: a FastAPI app (minisgl_cli.server.app, in the front end
process) over an engine running in another process (engine.engine_loop), reached through engine.remote_llm.RemoteLLM.
Nothing is imported here, so the CLI imports without FastAPI and uvicorn."""
