"""Deploy-config problems: where each came from (file and key path) and how to fix it.

Pydantic's validation errors are turned into the same ``ConfigProblem`` the
graph and contract checks report, naming the file that set the key, the
valid keys where one is unknown, and a fix.
"""
from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class ConfigProblem:
    file: str
    key_path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.key_path}" if self.key_path else self.file
        return f"{where}: {self.problem}. Fix: {self.fix}"


class DeployConfigError(ValueError):
    def __init__(self, problems: list[ConfigProblem]):
        self.problems = problems
        super().__init__("invalid deploy config:\n" + "\n".join(f"  {p}" for p in problems))


# A key path inside the merged document; stage entries are keyed by stage_id.
KeyPath = tuple[Any, ...]


class Origins:
    """Which file set which key, so that a problem names the file to edit."""

    def __init__(self, top: str):
        self.top = top
        self._by_path: dict[KeyPath, str] = {}

    def set(self, path: KeyPath, file: str) -> None:
        for key in [k for k in self._by_path if k[: len(path)] == path]:
            del self._by_path[key]
        self._by_path[path] = file

    def of(self, path: KeyPath) -> str:
        for n in range(len(path), 0, -1):
            if path[:n] in self._by_path:
                return self._by_path[path[:n]]
        return self.top


def _display(path: KeyPath) -> str:
    out = ""
    for i, part in enumerate(path):
        if i == 1 and path[0] == "stages":
            out += f"[id={part}]"
        elif isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def problem_at(origins: Origins, path: KeyPath, problem: str, fix: str) -> ConfigProblem:
    return ConfigProblem(origins.of(path), _display(path), problem, fix)


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the key at ``loc`` (for listing valid keys)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):  # an entry of list[X]
            args = typing.get_args(current)
            current = args[0] if args else None
        elif isinstance(current, type) and issubclass(current, BaseModel):
            field = next((f for name, f in current.model_fields.items() if part in (name, f.alias)), None)
            current = field.annotation if field else None
        else:
            return None
        if typing.get_origin(current) in (typing.Union, types.UnionType):  # X | None -> X
            current = next(a for a in typing.get_args(current) if a is not type(None))
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _keys_of(model: type[BaseModel]) -> str:
    return ", ".join(f.alias or name for name, f in model.model_fields.items())


def _fix_for(error: dict[str, Any], owner: type[BaseModel] | None) -> str:
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "extra_forbidden":
        keys = _keys_of(owner) if owner else "see docs/deploy-config.md"
        return f"remove the key or correct its spelling; valid keys here: {keys}"
    if kind == "missing":
        return f"add the key {error['loc'][-1]!r}"
    if kind == "literal_error":
        return f"use one of {ctx.get('expected')}"
    if kind == "bytes":
        return "write a byte count: an integer >= 0 or a string such as '512 MiB'"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        bound = next(iter(ctx.values()), "")
        return f"use a value {dict(greater_than_equal='>=', greater_than='>', less_than_equal='<=', less_than='<')[kind]} {bound}"
    if kind in ("too_short",):
        return "add at least one entry"
    return "see docs/deploy-config.md for the expected type"


def pydantic_problems(exc: ValidationError, doc: dict[str, Any], origins: Origins, root: type[BaseModel], prefix: KeyPath = ()) -> list[ConfigProblem]:
    problems = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        path = list(prefix)
        for i, part in enumerate(loc):
            if not prefix and i == 1 and loc[0] == "stages" and isinstance(part, int):
                entry = (doc.get("stages") or [None])[part]
                path.append(entry.get("stage_id", part) if isinstance(entry, dict) else part)
            else:
                path.append(part)
        owner = _model_at(root, loc[:-1]) if error["type"] == "extra_forbidden" else None
        problem = error["msg"] if error["type"] != "extra_forbidden" else f"unknown key {loc[-1]!r}"
        problems.append(problem_at(origins, tuple(path), problem, _fix_for(error, owner)))
    return problems
