"""The memory plan of a deploy config: every stage's reservation in the shared-RAM ledger.

``plan_deploy(config, profile)`` resolves each stage's reservation (explicit
bytes from the config; unset items from the executor's own plan), adds the
transport buffers it may hold (max unacknowledged payloads x its largest
payload), books all of them against the pools of the machine profile, and
refuses the deploy when a pool is overrun or a stage is placed on a device the
machine lacks. Nothing is loaded. Served over HTTP, the server's request
bodies are booked too (``body_bytes_in_flight``, its
``--max-body-bytes-in-flight``), and so is what else the process holds
(``beside``: serve's text model beside a speech pipeline), so that two plans
never each count the same free memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from edge_infer.memory.device import MachineProfile, machine_profile
from edge_infer.memory.ledger import ITEMS, Reservation, SharedRamLedger, format_bytes
from edge_infer.runtime.config import DeployConfig, StageConfig
from edge_infer.runtime.executors import ReservationPlan, executor_target, load_executor


@dataclass(frozen=True)
class StagePlan:
    stage_id: int
    label: str
    device: str
    reservation: Reservation
    max_payload_bytes: int
    from_executor: tuple[str, ...]  # items the executor planned ("auto"); the rest came from the config

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage_id": self.stage_id,
            "label": self.label,
            "device": self.device,
            "max_payload_bytes": self.max_payload_bytes,
            "from_executor": list(self.from_executor),
            **self.reservation.to_dict(),
        }


@dataclass(frozen=True)
class PoolPlan:
    name: str
    devices: tuple[str, ...]
    capacity_bytes: int
    reserved_bytes: int
    stage_ids: tuple[int, ...]

    @property
    def fits(self) -> bool:
        return self.reserved_bytes <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "devices": list(self.devices), "stage_ids": list(self.stage_ids), "fits": self.fits}


@dataclass
class DeployPlan:
    config_source: str
    profile: MachineProfile
    stages: list[StagePlan] = field(default_factory=list)
    pools: list[PoolPlan] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    server: Reservation | None = None  # the HTTP server's request bodies in flight, when served
    beside: list[Reservation] = field(default_factory=list)  # the rest of the process (a text model served beside)

    @property
    def admitted(self) -> bool:
        return not self.reasons

    def stage(self, stage_id: int) -> StagePlan:
        return next(s for s in self.stages if s.stage_id == stage_id)

    @property
    def stages_bytes(self) -> int:
        """What the stages reserve, all pools together (not the server's bodies or what is beside them)."""
        return sum(s.reservation.total_bytes for s in self.stages)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config_source,
            "profile": self.profile.name,
            "admitted": self.admitted,
            "reasons": list(self.reasons),
            "stages": [s.to_dict() for s in self.stages],
            "pools": [p.to_dict() for p in self.pools],
            "server": self.server.to_dict() if self.server else None,
            "beside": [r.to_dict() for r in self.beside],
        }

    def render(self) -> str:
        """The plan as a text table (for ``edge-infer plan --deploy-config``)."""
        cols = ["stage", "device", "pool", "weights", "kv", "buffers", "runtime", "transport", "total"]
        rows = [
            [s.label, s.device, s.reservation.pool, *(format_bytes(getattr(s.reservation, i)) for i in ITEMS), format_bytes(s.reservation.total_bytes)]
            for s in self.stages
        ]
        for other in ([self.server] if self.server else []) + self.beside:
            rows.append([other.owner, other.device, other.pool, *(format_bytes(getattr(other, i)) for i in ITEMS),
                         format_bytes(other.total_bytes)])
        widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
        line = lambda cells: "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
        out = [f"deploy plan: {self.config_source} on machine profile '{self.profile.name}' ({self.profile.source})", line(cols)]
        out += [line(r) for r in rows]
        for pool in self.pools:
            state = "fits" if pool.fits else "DOES NOT FIT"
            out.append(
                f"pool {pool.name} (devices: {', '.join(pool.devices) or 'none present'}): {format_bytes(pool.reserved_bytes)} reserved "
                f"of {format_bytes(pool.capacity_bytes)} usable - {state}"
            )
        auto = [f"stage {s.stage_id}: {'all items' if len(s.from_executor) == 5 else ', '.join(s.from_executor)}" for s in self.stages if s.from_executor]
        if auto:
            out.append("planned by the executor (reservation: auto): " + "; ".join(auto))
        out.append("ADMITTED" if self.admitted else "REFUSED:\n" + "\n".join(f"  - {r}" for r in self.reasons))
        return "\n".join(out)


def resolve_reservation(stage: StageConfig) -> tuple[ReservationPlan, tuple[str, ...]]:
    """Config bytes where set, the executor's plan for the rest."""
    fields = ("weights_bytes", "kv_bytes", "buffers_bytes", "runtime_bytes", "max_payload_bytes")
    explicit = {f: getattr(stage.reservation, f) for f in fields if getattr(stage.reservation, f) is not None}
    missing = tuple(f for f in fields if f not in explicit)
    if not missing:
        return ReservationPlan(**explicit), ()
    planned = load_executor(executor_target(stage.executor)).plan(stage)
    return ReservationPlan(**{f: explicit.get(f, getattr(planned, f)) for f in fields}), missing


def plan_deploy(config: DeployConfig, profile: MachineProfile | str | None = None,
                body_bytes_in_flight: int = 0, beside: Sequence[Reservation] = ()) -> DeployPlan:
    machine = machine_profile(profile)
    plan = DeployPlan(config.source, machine, beside=list(beside))
    ledger = SharedRamLedger(machine.pools)
    for other in beside:
        ledger.record(other)
    if body_bytes_in_flight:
        from edge_infer.memory.sizing import request_bodies_bytes  # measured per-byte cost; heavier imports

        plan.server = Reservation(owner="server: request bodies", pool=machine.device("cpu").pool or machine.pools[0].name,
                                  device="cpu", buffers_bytes=request_bodies_bytes(body_bytes_in_flight))
        ledger.record(plan.server)
    max_unacked = config.connectors.shared_memory.max_unacked_per_producer
    for stage in config.stages:
        device = machine.device(stage.device)
        if not device.present:
            plan.reasons.append(
                f"{stage.label} is placed on {stage.device}, which this machine lacks ({device.note}); "
                f"place it on cpu or plan against a profile that has one (e.g. --profile laptop)"
            )
        try:
            resolved, auto = resolve_reservation(stage)
        except Exception as exc:  # noqa: BLE001 - an executor that cannot plan refuses the deploy
            plan.reasons.append(f"{stage.label}: its reservation cannot be planned: {exc}")
            continue
        pool = device.pool or machine.pools[0].name
        reservation = Reservation(
            owner=f"stage {stage.stage_id} ({stage.name or stage.kind})",
            pool=pool,
            device=stage.device,
            weights_bytes=resolved.weights_bytes,
            kv_bytes=resolved.kv_bytes,
            buffers_bytes=resolved.buffers_bytes,
            runtime_bytes=resolved.runtime_bytes,
            transport_bytes=max_unacked * resolved.max_payload_bytes,
        )
        ledger.record(reservation)
        plan.stages.append(StagePlan(stage.stage_id, stage.label, stage.device, reservation, resolved.max_payload_bytes, auto))
    for usage in ledger.pools():
        devices = tuple(machine.devices_on(usage.pool.name))
        plan.pools.append(
            PoolPlan(usage.pool.name, devices, usage.pool.capacity_bytes, usage.reserved_bytes,
                     tuple(s.stage_id for s in plan.stages if s.reservation.pool == usage.pool.name))
        )
        if usage.over:
            ids = [str(s.stage_id) for s in plan.stages if s.reservation.pool == usage.pool.name]
            owners = [f"stages {', '.join(ids)}" if len(ids) > 1 else f"stage {ids[0]}"] if ids else []
            if plan.server and plan.server.pool == usage.pool.name:
                owners.append("the server's request bodies (--max-body-bytes-in-flight)")
            owners += [other.owner for other in beside if other.pool == usage.pool.name]
            who = " and ".join(owners) + (" together overrun" if len(ids) + len(owners) > 2 else " overruns")
            plan.reasons.append(
                f"{who} {usage.describe(devices)}; lower a stage's reservation "
                "(kv_cache_memory_bytes, max_num_seqs, max_model_len, quantization) or move a stage to a pool with room"
            )
    return plan
