"""The server's FastAPI application: the shared routes, and each served model's route set.

``/health``, ``/metrics``, ``/v1/models`` and ``/v1/models/{id}`` are
written once, over every served model (a text model, a speech model, or
both in one process); each model's own routes come from its kind's router.
A route of a kind nobody serves answers 404 saying what this server does
serve.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Sequence

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from edge_infer.server.errors import APIError
from edge_infer.server.http import base_app
from edge_infer.server.protocol import ModelCard, ModelList
from edge_infer.server.responses import ERROR_RESPONSES
from edge_infer.server.service import Service
from edge_infer.server.speech_routes import speech_router
from edge_infer.server.text_routes import text_router

ROUTERS = {"text": text_router, "speech": speech_router}
# The routes of each kind, answered with a pointer to what is served when no model of that kind is.
KIND_PATHS = {"text": ("/v1/chat/completions", "/v1/completions"), "speech": ("/v1/audio/speech", "/v1/audio/voices")}


def build_app(services: Sequence[Service], loader: Callable[[], Awaitable[None]] | None = None) -> FastAPI:
    """The app over ``services`` (one shared metrics registry); ``loader`` loads them (default: each one's load)."""
    services = list(services)
    shared = services[0].metrics.shared
    app, auth = base_app(services, shared, loader)

    @app.get("/health", responses={503: {"description": "loading, shutting down, or a model's engine is dead, "
                                                       "unresponsive or restarting (see status and detail)"}})
    async def health(model: str | None = None) -> JSONResponse:
        """The server's health: 503 while any model is in trouble; ``?model=NAME``: that model's alone (a load
        balancer in front of one of two models served together)."""
        if model is not None:
            service = next((s for s in services if s.settings.served_model_name == model), None)
            if service is None:
                services[0].check_model(model)  # raises the 404 naming what is served
            status, detail, extra = service.health()
            alone = {"status": status, **({"detail": detail} if status != "ok" else {}), **extra}
            return JSONResponse(alone, status_code=200 if status == "ok" else 503)
        reports = {s.settings.served_model_name: s.health() for s in services}
        body: dict[str, Any] = {}
        for status, detail, extra in reports.values():  # the first model in trouble speaks for the server
            if status != "ok":
                body = {"status": status, "detail": detail, **extra}
                break
        else:
            body = {"status": "ok", **next(iter(reports.values()))[2]}
        if len(services) > 1:
            body["models"] = {name: {"status": st, "detail": d} for name, (st, d, _) in reports.items()}
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    # HEAD too, as load balancers' health checks send it (a GET route refuses it: 405); one operation in the schema
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        await asyncio.gather(*(s.refresh_metrics() for s in services))
        return Response(shared.render(), media_type=CONTENT_TYPE_LATEST)

    def card(service: Service) -> ModelCard:
        if service.phase == "ready" and (down := service.down_reason()) is not None:
            raise APIError(503, down, code=service.health_status)
        return service.model_card()

    @app.get("/v1/models", dependencies=auth, response_model=ModelList, responses=ERROR_RESPONSES)
    async def models() -> ModelList:
        return ModelList(data=[card(s) for s in services])

    @app.get("/v1/models/{model_id:path}", dependencies=auth, response_model=ModelCard, responses=ERROR_RESPONSES)
    async def model(model_id: str) -> ModelCard:
        for service in services:
            if service.settings.served_model_name == model_id:
                return card(service)
        services[0].check_model(model_id)  # raises the 404 naming what is served

    link_neighbours(services)
    for service in services:
        app.include_router(ROUTERS[service.kind](service, auth))
    served = {s.kind for s in services}
    for kind, paths in KIND_PATHS.items():
        if kind not in served:
            _point_elsewhere(app, kind, paths, services)
    return app


def link_neighbours(services: Sequence[Service]) -> None:
    """Tell each service the other models this server serves (their kind and route), for a 404 that says where to
    send a request; one of the same name is left out (each route serves its own model under it)."""
    for service in services:
        name = service.settings.served_model_name
        service.neighbours = {other.settings.served_model_name: (other.kind, KIND_PATHS[other.kind][0])
                              for other in services if other.settings.served_model_name != name}


def _point_elsewhere(app: FastAPI, kind: str, paths: tuple[str, ...], services: list[Service]) -> None:
    names = ", ".join(f"{s.settings.served_model_name!r} ({s.kind})" for s in services)
    endpoints = ", ".join(p for s in services for p in KIND_PATHS[s.kind])

    async def not_served() -> None:
        raise APIError(404, f"this server serves no {kind} model: it serves {names} at {endpoints}", code=f"not_a_{kind}_model")

    for path in paths:
        app.add_api_route(path, not_served, methods=["GET", "POST"], include_in_schema=False)
