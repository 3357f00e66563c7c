"""The HTTP pieces both servers (text and speech) share.

``base_app`` builds a FastAPI app that loads the model in the background
and closes it at exit, with OpenAI-shaped error handlers, request counting
and the API-key check; ``EventStream`` is a streamed response that releases
its requests however the response ends.
"""
from __future__ import annotations

import asyncio
import secrets
from contextlib import asynccontextmanager, suppress
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from edge_infer.server.errors import APIError, install_handlers
from edge_infer.server.lifecycle import ServingState
from edge_infer.server.streaming import HEADERS, MEDIA_TYPE

# The status nginx logs for a client that closed the connection first; nobody reads the body.
CLIENT_CLOSED = 499


class RequestCounter:
    """ASGI middleware counting responses by path and status (it never touches the body)."""

    def __init__(self, app: Any, metrics: Any):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [CLIENT_CLOSED]

        async def send_and_note(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.count_request(scope["path"], status[0])


class EventStream(StreamingResponse):
    """A streamed response (SSE unless told otherwise) that ends its generation however the response ends.

    A client can leave before the body is iterated at all; the body's own
    ``finally`` would then never run, and its engine requests would hold
    their admission and KV blocks.
    """

    def __init__(self, content: AsyncIterator[str | bytes], on_close: Callable[[], None], media_type: str = MEDIA_TYPE):
        super().__init__(content, media_type=media_type, headers=HEADERS)
        self.on_close = on_close

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def api_key_check(api_key: str | None) -> Callable[..., None]:
    bearer = HTTPBearer(auto_error=False, description="the server's --api-key, when it has one")

    def check(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if api_key is None:
            return
        if credentials is None:
            raise APIError(401, "this server needs an API key: send 'Authorization: Bearer KEY'", code="missing_api_key")
        if not secrets.compare_digest(credentials.credentials.encode(), api_key.encode()):
            raise APIError(401, "the API key is wrong", code="invalid_api_key")

    return check


async def wait_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def base_app(title: str, state: ServingState, loader: Callable[[], Awaitable[None]] | None = None):
    """A FastAPI app that loads the model in the background and closes it at exit.

    Returns the app and the route dependencies that check the API key.
    """
    from edge_infer import __version__

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        loading = asyncio.create_task((loader or state.load)())
        try:
            yield
        finally:
            # A worker still loading is closed once it is up: stopping it mid-load would orphan it.
            with suppress(Exception):
                await loading
            await state.close()

    app = FastAPI(title=title, version=__version__, lifespan=lifespan)
    install_handlers(app)
    app.add_middleware(RequestCounter, metrics=state.metrics)
    return app, [Depends(api_key_check(state.settings.api_key))]
