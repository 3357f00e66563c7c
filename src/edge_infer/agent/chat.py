"""The model side of the loop: one chat completion against an OpenAI-compatible server.

``ChatModel`` is what the loop needs; ``OpenAIChat`` implements it with the
official ``openai`` client (``pip install 'edge-infer[agent]'``), and tests
script their own. Transport and HTTP failures become ``ChatError`` with the
server's address and what to do.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from edge_infer.errors import EdgeInferError


class ChatError(EdgeInferError, RuntimeError):
    """The server could not be reached or refused the request."""


@dataclass(frozen=True)
class Reply:
    """What one completion said: text, the calls the server parsed, and its own repair reports."""

    content: str
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON text)
    server_recoveries: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ChatModel(Protocol):
    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], thinking: bool = True) -> Reply: ...


class OpenAIChat:
    def __init__(self, base_url: str, model: str | None = None, api_key: str = "unused", max_tokens: int = 1024,
                 temperature: float = 0.0, timeout_s: float = 120.0):
        try:
            import openai
        except ImportError:
            raise ChatError("the agent talks to the server with the openai client: pip install 'edge-infer[agent]'") from None
        self._openai = openai
        self.base_url = base_url
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0)
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except self._openai.APIConnectionError as exc:
            raise ChatError(f"cannot reach the server at {self.base_url} ({exc}); start one with `edge-infer serve`") from None
        except self._openai.APIStatusError as exc:
            raise ChatError(f"the server at {self.base_url} refused {what} with HTTP {exc.status_code}: {exc.message}") from None

    def model_name(self) -> str:
        if self.model is None:
            models = self._call("the model list", self.client.models.list).data
            if not models:
                raise ChatError(f"the server at {self.base_url} serves no model")
            self.model = models[0].id
        return self.model

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], thinking: bool = True) -> Reply:
        extra = None if thinking else {"chat_template_kwargs": {"enable_thinking": False}}
        out = self._call(
            "the chat completion", self.client.chat.completions.create, model=self.model_name(), messages=messages,
            tools=tools, max_tokens=self.max_tokens, temperature=self.temperature, extra_body=extra,
        )
        if not out.choices:
            raise ChatError(f"the server at {self.base_url} returned a completion without choices")
        choice = out.choices[0]
        calls = [(c.function.name, c.function.arguments or "") for c in choice.message.tool_calls or [] if c.function]
        report = (choice.model_extra or {}).get("edge_infer") or {}
        recoveries = [f"{r.get('problem')}: {r.get('action')}" for r in report.get("tool_call_recovery") or []]
        usage = out.usage
        return Reply(
            choice.message.content or "", calls, recoveries,
            usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0,
        )


def wait_for_server(base_url: str, timeout_s: float = 60.0, api_key: str = "unused") -> str:
    """Poll until the server lists a model; returns its name."""
    chat = OpenAIChat(base_url, api_key=api_key, timeout_s=5.0)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return chat.model_name()
        except ChatError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
