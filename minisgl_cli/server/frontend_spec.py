"""What `minisgl serve` hands its HTTP front end process (minisgl_cli.server.frontend), apart from the front end
itself so that the CLI imports without the server's packages (uvicorn, FastAPI): a bench-offline peer child runs
the CLI under another engine's environment."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.ipc import Addresses

ORPHAN_GRACE_S = 2.0  # /health answers 503 this long after the engine is gone, then the front end exits
ENGINE_GONE_EXIT = 3
API_KEY_ENV = "MINISGL_API_KEY"  # serve --api-key's variable, and how the key reaches the front end


@dataclass(frozen=True, slots=True)
class FrontendSpec:
    model: str | None  # as --model: where the tokenizer comes from
    addrs: Addresses | None  # filled in by whoever starts the front end (serve_engine)
    host: str
    port: int
    model_name: str | None
    max_queued_requests: int | None
    log_level: str
    engine_pid: int
    # the listening socket, bound by the command before it loaded the model and passed to the front end (pass_fds);
    # None: the front end binds host:port itself
    fd: int | None = None
    allowed_origins: tuple[str, ...] = ()  # --allowed-origins: browser origins answered with CORS headers
    # what a request that leaves a sampling field out gets: the model's generation_config.json (--generation-config)
    sampling_defaults: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> FrontendSpec:
        d = json.loads(text)
        addrs = Addresses(**d["addrs"]) if d["addrs"] else None
        return FrontendSpec(**{**d, "addrs": addrs, "allowed_origins": tuple(d["allowed_origins"])})
