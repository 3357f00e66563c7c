"""What a text server knows: its engine and frontend, on top of the shared serving state."""
from __future__ import annotations

from typing import Callable

from edge_infer.engine.async_engine import AsyncEngine
from edge_infer.engine.frontend import Frontend
from edge_infer.models.config import ModelConfig
from edge_infer.server.lifecycle import ServeSettings, ServingState
from edge_infer.server.metrics import ServerMetrics


class ServerState(ServingState):
    def __init__(self, frontend: Frontend, settings: ServeSettings, worker: str = "process"):
        super().__init__(settings, ServerMetrics(frontend.plan), frontend.engine_config.max_num_seqs)
        self.frontend = frontend
        self.engine = AsyncEngine(frontend, worker=worker)
        self.vocab_size = ModelConfig.from_dir(frontend.plan.model).vocab_size

    async def _start(self, progress: Callable[[int, int], None] | None) -> None:
        await self.engine.start(progress)

    def down_reason(self) -> str | None:
        return None if self.engine.healthy else f"the engine worker is down ({self.engine.dead_reason})"

    async def close(self) -> None:
        await self.engine.close()
