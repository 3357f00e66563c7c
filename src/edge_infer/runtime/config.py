"""Deploy configs: the YAML schema, ``base_config`` overlays, stage overrides, checks.

Precedence, highest first: stage overrides (``--stage-overrides``) > the file >
its ``base_config`` chain (nearest first) > schema defaults. ``stages`` are
merged by ``stage_id``; other mappings are merged key by key; scalars and
lists are replaced. docs/deploy-config.md is the reference for every key.

Every problem is reported with the file that set the offending key, the key
path and a fix; the graph (a DAG of routes) and the payload contracts are
checked against the executors' declarations before any process starts.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from edge_infer.runtime.config_problems import ConfigProblem, DeployConfigError, KeyPath, Origins, problem_at, pydantic_problems

CONFIG_DIR = Path(__file__).parent / "configs"
OVERRIDES = "--stage-overrides"

Device = Literal["cpu", "igpu", "npu"]
StageKind = Literal["ar", "generation", "external"]


def _parse_bytes(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise PydanticCustomError("bytes", "a byte count cannot be negative, got {value}", {"value": value})
        return value
    if isinstance(value, str):
        try:
            return int(TypeAdapter(ByteSize).validate_python(value.strip()))
        except ValidationError:
            pass
    raise PydanticCustomError("bytes", "cannot read '{value}' as a byte count", {"value": value})


Bytes = Annotated[int, BeforeValidator(_parse_bytes)]


def _media_limits(value: Any) -> Any:
    """Names of ``media.limits.LIMITS`` with numbers >= 0 (the flags' --max-images ... as keys: max_images)."""
    from edge_infer.media.limits import LIMITS

    if not isinstance(value, Mapping):
        raise PydanticCustomError("media_limits", "media_limits is a mapping such as {{max_images: 1}}, got {value}",
                                  {"value": value})
    for name, limit in value.items():
        if name not in LIMITS:
            raise PydanticCustomError("media_limits", "unknown media limit '{name}'; known: {known}",
                                      {"name": name, "known": ", ".join(LIMITS)})
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0:
            raise PydanticCustomError("media_limits", "media limit {name} must be a number >= 0, got {limit}",
                                      {"name": name, "limit": limit})
    return dict(value)


MediaLimitSettings = Annotated[dict[str, float], BeforeValidator(_media_limits)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ReservationConfig(_Strict):
    """Bytes a stage holds. An unset item (or ``reservation: auto``) comes from the executor's plan."""

    weights_bytes: Bytes | None = None
    kv_bytes: Bytes | None = None
    buffers_bytes: Bytes | None = None
    runtime_bytes: Bytes | None = None
    max_payload_bytes: Bytes | None = None

    @model_validator(mode="before")
    @classmethod
    def _auto(cls, value: Any) -> Any:
        if value == "auto":
            return {}
        if isinstance(value, str):
            raise PydanticCustomError("reservation", "reservation must be 'auto' or a mapping of byte counts, got {value}", {"value": value})
        return value


class EngineSettings(_Strict):
    max_model_len: int | None = Field(default=None, ge=1)
    max_num_seqs: int = Field(default=1, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    kv_cache_memory_bytes: Bytes | None = None
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    quantization: str | None = None
    # With quantization "auto" (implied when only a priority is given): what the weight path optimizes.
    priority: Literal["speed", "fidelity", "memory"] | None = None
    # A multimodal thinker's (the text executor's): its towers' weight path (edge-infer's --encoder-quantization)
    # and what one request may carry, which its plan sizes (--max-images, ...; unset: the plan's defaults).
    encoder_quantization: Literal["none", "same", "cpu_int4", "cpu_w4a16", "cpu_w4a8", "cpu_w8a8", "auto"] = "auto"
    media_limits: MediaLimitSettings | None = None


class SamplingDefaults(_Strict):
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0)
    top_k: int | None = None
    top_p: float | None = Field(default=None, gt=0, le=1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    logprobs: int | None = Field(default=None, ge=0)

    def as_params(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class StageConfig(_Strict):
    stage_id: int = Field(ge=0)
    kind: StageKind
    executor: str
    name: str | None = None
    model: str | None = None
    device: Device = "cpu"
    # Unix nice increment of the stage's process: a niced stage uses the cores the
    # others leave idle and gets a smaller share of a core they contend for.
    nice: int = Field(default=0, ge=0, le=19)
    reservation: ReservationConfig = ReservationConfig()
    engine: EngineSettings = EngineSettings()
    default_sampling: SamplingDefaults = SamplingDefaults()
    executor_options: dict[str, Any] = {}

    @property
    def label(self) -> str:
        return f"stage {self.stage_id} ({self.name or self.kind}, executor {self.executor})"


class RouteConfig(_Strict):
    from_stage: int = Field(alias="from", ge=0)
    to_stage: int = Field(alias="to", ge=0)
    contract: str


class SharedMemoryConnector(_Strict):
    inline_threshold_bytes: Bytes = 64 * 1024
    max_unacked_per_producer: int = Field(default=8, ge=1)


class Connectors(_Strict):
    shared_memory: SharedMemoryConnector = SharedMemoryConnector()


class PipelineSettings(_Strict):
    name: str | None = None
    stage_start_timeout_s: float = Field(default=120.0, gt=0)
    abort_timeout_s: float = Field(default=5.0, gt=0)
    shutdown_timeout_s: float = Field(default=5.0, gt=0)


class DeployConfig(_Strict):
    pipeline: PipelineSettings = PipelineSettings()
    connectors: Connectors = Connectors()
    stages: list[StageConfig] = Field(min_length=1)
    routes: list[RouteConfig] = []
    final_outputs: list[int] = Field(min_length=1)

    _source: str = PrivateAttr(default="<memory>")

    @model_validator(mode="after")
    def _in_stage_order(self) -> "DeployConfig":
        # Per-stage lists (sampling_params_list) are given in stage_id order.
        self.stages.sort(key=lambda s: s.stage_id)
        return self

    @property
    def source(self) -> str:
        return self._source

    def stage(self, stage_id: int) -> StageConfig:
        for stage in self.stages:
            if stage.stage_id == stage_id:
                return stage
        raise KeyError(f"no stage {stage_id} in {self._source}")

    @property
    def stage_ids(self) -> list[int]:
        return [s.stage_id for s in self.stages]

    def routes_from(self, stage_id: int) -> list[RouteConfig]:
        return [r for r in self.routes if r.from_stage == stage_id]

    def upstream(self, stage_id: int) -> list[int]:
        return sorted({r.from_stage for r in self.routes if r.to_stage == stage_id})

    def downstream(self, stage_id: int) -> list[int]:
        return sorted({r.to_stage for r in self.routes if r.from_stage == stage_id})

    @property
    def source_stages(self) -> list[int]:
        return [sid for sid in self.stage_ids if not self.upstream(sid)]


# --- loading and merging -----------------------------------------------------


def bundled_configs() -> dict[str, Path]:
    return {p.stem: p for p in sorted(CONFIG_DIR.glob("*.yaml"))}


def resolve_config_path(source: str | os.PathLike[str], relative_to: Path | None = None) -> Path:
    """A file path (relative to ``relative_to`` when given) or a bundled config's name."""
    raw = Path(source)
    candidate = (relative_to / raw) if relative_to is not None and not raw.is_absolute() else raw
    if candidate.is_file():
        return candidate.resolve()
    bundled = bundled_configs().get(raw.stem if raw.suffix == ".yaml" and raw.parent == Path(".") else str(raw))
    if bundled is not None:
        return bundled
    raise FileNotFoundError(
        f"deploy config {str(source)!r} not found (looked for {candidate} and a bundled config of that name); "
        f"bundled configs: {', '.join(bundled_configs()) or 'none'}"
    )


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise DeployConfigError([ConfigProblem(str(path), "", f"not valid YAML: {exc}", "correct the YAML syntax at the position shown")]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DeployConfigError([ConfigProblem(str(path), "", f"the top level is a {type(data).__name__}, not a mapping", "write the config as a mapping with keys such as stages:, routes:, final_outputs:")])
    return data


def _check_stage_entries(stages: Any, file: str) -> None:
    """Stages are merged by stage_id, so each entry needs a unique integer one."""
    if stages is None:
        return
    if not isinstance(stages, list):
        raise DeployConfigError([ConfigProblem(file, "stages", f"stages must be a list, got {type(stages).__name__}", "write stages as a YAML list of mappings, each with a stage_id")])
    seen: dict[int, int] = {}
    problems = []
    for i, entry in enumerate(stages):
        sid = entry.get("stage_id") if isinstance(entry, dict) else None
        if not isinstance(entry, dict):
            problems.append(ConfigProblem(file, f"stages[{i}]", f"a stage must be a mapping, got {type(entry).__name__}", "write the stage as a mapping with stage_id, kind, executor"))
        elif not (isinstance(sid, int) and not isinstance(sid, bool) and sid >= 0):
            problems.append(ConfigProblem(file, f"stages[{i}].stage_id", f"stage_id must be an integer >= 0, got {sid!r}", "give every stage a unique integer stage_id (0, 1, ...)"))
        elif sid in seen:
            problems.append(ConfigProblem(file, f"stages[{i}].stage_id", f"stage_id {sid} is used twice (also by stages[{seen[sid]}])", "give every stage a unique stage_id"))
        else:
            seen[sid] = i
    if problems:
        raise DeployConfigError(problems)


def _overlay(base: Any, over: Any, path: KeyPath, origins: Origins, file: str) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            if path == () and key == "stages":
                out[key] = _merge_stages(base.get("stages") or [], value or [], origins, file)
            elif key in out:
                out[key] = _overlay(out[key], value, path + (key,), origins, file)
            else:
                out[key] = value
                origins.set(path + (key,), file)
        return out
    origins.set(path, file)
    return over


def _merge_stages(base: list[dict], over: list[dict], origins: Origins, file: str) -> list[dict]:
    out = [dict(s) for s in base]
    index = {s["stage_id"]: i for i, s in enumerate(out)}
    for stage in over:
        sid = stage["stage_id"]
        if sid in index:
            out[index[sid]] = _overlay(out[index[sid]], stage, ("stages", sid), origins, file)
        else:
            index[sid] = len(out)
            out.append(dict(stage))
            origins.set(("stages", sid), file)
    return out


def _read_chain(path: Path, origins: Origins, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The file overlaid on its base_config chain (the base is read first)."""
    if path in chain:
        loop = " -> ".join(str(p) for p in chain + (path,))
        raise DeployConfigError([ConfigProblem(str(chain[-1]), "base_config", f"base_config chain loops: {loop}", "remove base_config from one of these files")])
    data = _read_yaml(path)
    base_ref = data.pop("base_config", None)
    _check_stage_entries(data.get("stages"), str(path))
    if base_ref is None:
        return _overlay({}, data, (), origins, str(path))
    if not isinstance(base_ref, str):
        raise DeployConfigError([ConfigProblem(str(path), "base_config", f"base_config must be a file path, got {base_ref!r}", "write base_config: other.yaml (relative to this file) or a bundled config name")])
    try:
        base_path = resolve_config_path(base_ref, relative_to=path.parent)
    except FileNotFoundError as exc:
        raise DeployConfigError([ConfigProblem(str(path), "base_config", str(exc), "point base_config at an existing file, relative to this file")]) from None
    base = _read_chain(base_path, origins, chain + (path,))
    return _overlay(base, data, (), origins, str(path))


def parse_stage_overrides(raw: str | Mapping[Any, Any] | None) -> dict[int, dict[str, Any]]:
    """``{"1": {...}}`` (JSON text or a mapping) -> {1: {...}}."""
    if raw is None or raw == "":
        return {}
    example = '\'{"1": {"engine": {"max_num_seqs": 2}}}\''
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DeployConfigError([ConfigProblem(OVERRIDES, "", f"not valid JSON: {exc}", f"pass a JSON object keyed by stage id, e.g. {example}")]) from None
    if not isinstance(raw, Mapping):
        raise DeployConfigError([ConfigProblem(OVERRIDES, "", f"expected a JSON object keyed by stage id, got {type(raw).__name__}", f"pass e.g. {example}")])
    out: dict[int, dict[str, Any]] = {}
    problems = []
    for key, value in raw.items():
        try:
            sid = int(key)
        except (TypeError, ValueError):
            problems.append(ConfigProblem(OVERRIDES, f"[{key!r}]", f"{key!r} is not a stage id", f"key each override by an integer stage id, e.g. {example}"))
            continue
        if not isinstance(value, Mapping):
            problems.append(ConfigProblem(OVERRIDES, f"[{key!r}]", f"the override of stage {sid} must be an object, got {type(value).__name__}", f"e.g. {example}"))
            continue
        out[sid] = dict(value)
    if problems:
        raise DeployConfigError(problems)
    return out


def _apply_overrides(doc: dict[str, Any], overrides: dict[int, dict[str, Any]], origins: Origins) -> dict[str, Any]:
    stages = doc.get("stages") or []
    by_id = {s["stage_id"]: i for i, s in enumerate(stages)}
    problems = []
    for sid, over in overrides.items():
        if sid not in by_id:
            problems.append(ConfigProblem(OVERRIDES, f"[\"{sid}\"]", f"no stage {sid} in {origins.top}", f"use one of the stage ids {sorted(by_id)}"))
        elif over.get("stage_id", sid) != sid:
            problems.append(ConfigProblem(OVERRIDES, f"[\"{sid}\"].stage_id", "an override cannot change a stage's id", "remove stage_id from the override"))
        else:
            stages[by_id[sid]] = _overlay(stages[by_id[sid]], over, ("stages", sid), origins, OVERRIDES)
    if problems:
        raise DeployConfigError(problems)
    return doc


# --- validation --------------------------------------------------------------


def _resolve_models(config: DeployConfig, origins: Origins) -> None:
    """A relative ``model`` path is relative to the file that sets it."""
    for i, stage in enumerate(config.stages):
        if not stage.model or Path(stage.model).is_absolute():
            continue
        origin = origins.of(("stages", stage.stage_id, "model"))
        base = Path.cwd() if origin == OVERRIDES else Path(origin).parent
        candidate = base / stage.model
        if candidate.exists():
            config.stages[i] = stage.model_copy(update={"model": str(candidate.resolve())})


def _find_cycle(config: DeployConfig) -> list[int] | None:
    colour: dict[int, int] = {}
    stack: list[int] = []

    def visit(node: int) -> list[int] | None:
        colour[node] = 1
        stack.append(node)
        for nxt in config.downstream(node):
            if colour.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in colour and (found := visit(nxt)):
                return found
        stack.pop()
        colour[node] = 2
        return None

    for sid in config.stage_ids:
        if sid not in colour and (found := visit(sid)):
            return found
    return None


def check_deploy_config(config: DeployConfig, origins: Origins, doc: dict[str, Any]) -> list[ConfigProblem]:
    """Executors, options, graph and contracts; returns every problem found."""
    from edge_infer.runtime.contracts import known_contracts
    from edge_infer.runtime.executors import executor_target, load_executor, registered_executors

    problems: list[ConfigProblem] = []
    ids = set(config.stage_ids)
    classes = {}
    for stage in config.stages:
        at = ("stages", stage.stage_id)
        try:
            cls = load_executor(executor_target(stage.executor))
        except KeyError:
            problems.append(problem_at(origins, at + ("executor",), f"no executor named {stage.executor!r}", f"use one of {', '.join(registered_executors())} (or register yours with register_executor)"))
            continue
        except (ImportError, AttributeError, TypeError) as exc:
            problems.append(problem_at(origins, at + ("executor",), f"executor {stage.executor!r} cannot be imported: {exc}", "install what it needs or fix its registration"))
            continue
        classes[stage.stage_id] = cls
        if stage.kind not in cls.kinds:
            problems.append(problem_at(origins, at + ("kind",), f"executor {stage.executor} serves kind {'/'.join(sorted(cls.kinds))}, not {stage.kind}", f"set kind: {sorted(cls.kinds)[0]} or choose another executor"))
        if stage.device not in cls.devices:
            problems.append(problem_at(origins, at + ("device",), f"executor {stage.executor} runs on {', '.join(sorted(cls.devices))}, not {stage.device}", f"set device: {sorted(cls.devices)[0]} or choose an executor for {stage.device}"))
        if cls.requires_model and not stage.model:
            problems.append(problem_at(origins, at + ("model",), f"executor {stage.executor} needs a model", "set model: to the model file (relative to this deploy config)"))
        try:
            cls.options(stage)
        except ValidationError as exc:
            problems.extend(pydantic_problems(exc, doc, origins, cls.Options, prefix=at + ("executor_options",)))

    seen_routes = set()
    for i, route in enumerate(config.routes):
        at = ("routes", i)
        where = f"route {route.from_stage} -> {route.to_stage}"
        for end, sid in (("from", route.from_stage), ("to", route.to_stage)):
            if sid not in ids:
                problems.append(problem_at(origins, at + (end,), f"{where} names stage {sid}, which does not exist", f"use one of the stage ids {sorted(ids)}"))
        if route.from_stage == route.to_stage:
            problems.append(problem_at(origins, at, f"{where} loops onto its own stage", "remove the route; a pipeline is a DAG"))
        key = (route.from_stage, route.to_stage, route.contract)
        if key in seen_routes:
            problems.append(problem_at(origins, at, f"{where} carrying {route.contract} is listed twice", "remove the duplicate route"))
        seen_routes.add(key)
        if route.contract not in known_contracts():
            problems.append(problem_at(origins, at + ("contract",), f"unknown contract {route.contract!r}", f"use one of {', '.join(known_contracts())}"))
            continue
        producer, consumer = classes.get(route.from_stage), classes.get(route.to_stage)
        if producer is not None and route.contract not in producer.output_contracts:
            problems.append(problem_at(origins, at + ("contract",), f"{where} carries {route.contract}, but stage {route.from_stage} (executor {config.stage(route.from_stage).executor}) emits {', '.join(sorted(producer.output_contracts))}", "make the route's contract what the producer emits, or change the producer's executor"))
        if consumer is not None and route.contract not in consumer.input_contracts:
            problems.append(problem_at(origins, at + ("contract",), f"{where} carries {route.contract}, but stage {route.to_stage} (executor {config.stage(route.to_stage).executor}) accepts {', '.join(sorted(consumer.input_contracts))}", "route a contract the consumer accepts, or change the consumer's executor"))

    endpoints_known = all(r.from_stage in ids and r.to_stage in ids for r in config.routes)
    if endpoints_known and (cycle := _find_cycle(config)):
        problems.append(problem_at(origins, ("routes",), f"routes form a cycle: {' -> '.join(map(str, cycle))}", "remove a route on the cycle; a pipeline is a DAG"))

    for i, sid in enumerate(config.final_outputs):
        if sid not in ids:
            problems.append(problem_at(origins, ("final_outputs", i), f"final output stage {sid} does not exist", f"use one of the stage ids {sorted(ids)}"))
    if len(set(config.final_outputs)) != len(config.final_outputs):
        problems.append(problem_at(origins, ("final_outputs",), "a stage is listed twice", "list each stage once"))
    if len(ids) > 1:
        on_route = {r.from_stage for r in config.routes} | {r.to_stage for r in config.routes}
        for sid in sorted(ids - on_route):
            problems.append(problem_at(origins, ("stages", sid), f"stage {sid} is on no route, so no input can reach it", f"add a route to or from stage {sid}, or remove the stage"))
        for sid in sorted(on_route & ids):
            if not config.downstream(sid) and sid not in config.final_outputs:
                problems.append(problem_at(origins, ("final_outputs",), f"stage {sid} has no outgoing route and is not a final output: its outputs would be discarded", f"add {sid} to final_outputs or route its output onward"))
    return problems


def load_deploy_config(source: str | os.PathLike[str], stage_overrides: str | Mapping[Any, Any] | None = None) -> DeployConfig:
    """Read, overlay, override and check a deploy config (a path or a bundled name)."""
    path = resolve_config_path(source)
    origins = Origins(str(path))
    doc = _read_chain(path, origins)
    doc = _apply_overrides(doc, parse_stage_overrides(stage_overrides), origins)
    try:
        config = DeployConfig.model_validate(doc)
    except ValidationError as exc:
        raise DeployConfigError(pydantic_problems(exc, doc, origins, DeployConfig)) from None
    config._source = str(path)
    _resolve_models(config, origins)
    problems = check_deploy_config(config, origins, doc)
    if problems:
        raise DeployConfigError(problems)
    _apply_pipeline_options(config)
    return config


def _apply_pipeline_options(config: DeployConfig) -> None:
    """Options each executor takes from the contracts routed into its stage (``pipeline_options``), where the
    stage does not set them: e.g. a text stage fed media embeddings loads no towers."""
    from edge_infer.runtime.executors import executor_target, load_executor

    for i, stage in enumerate(config.stages):
        inputs = frozenset(r.contract for r in config.routes if r.to_stage == stage.stage_id)
        implied = load_executor(executor_target(stage.executor)).pipeline_options(stage, inputs)
        unset = {k: v for k, v in implied.items() if k not in stage.executor_options}
        if unset:
            config.stages[i] = stage.model_copy(update={"executor_options": {**stage.executor_options, **unset}})
