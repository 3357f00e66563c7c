"""The shared-RAM ledger: every stage's reservation, held against its memory pool.

On an edge box the CPU, the iGPU and the NPU usually draw on one physical
RAM pool, so two stages on "different devices" still compete for the same
bytes. The ledger keys reservations by pool, not by device: ``reserve``
refuses a reservation that would overrun its pool; ``record`` books it
unconditionally, so that a planner can list every stage of an overrun at once.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

from edge_infer.memory.device import MemoryPool

ITEMS = ("weights_bytes", "kv_bytes", "buffers_bytes", "runtime_bytes", "transport_bytes")


def format_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Reservation:
    """What one owner (a stage's worker) holds in one pool, itemised in bytes."""

    owner: str
    pool: str
    device: str
    weights_bytes: int = 0
    kv_bytes: int = 0
    buffers_bytes: int = 0  # activations and working buffers
    runtime_bytes: int = 0  # the process itself: interpreter, libraries, arenas
    transport_bytes: int = 0  # shared payload buffers it may hold unacknowledged

    def __post_init__(self) -> None:
        for item in ITEMS:
            if getattr(self, item) < 0:
                raise ValueError(f"reservation of {self.owner}: {item} is negative ({getattr(self, item)})")

    @property
    def total_bytes(self) -> int:
        return sum(getattr(self, item) for item in ITEMS)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class PoolUsage:
    pool: MemoryPool
    reservations: tuple[Reservation, ...]

    @property
    def reserved_bytes(self) -> int:
        return sum(r.total_bytes for r in self.reservations)

    @property
    def free_bytes(self) -> int:
        return self.pool.capacity_bytes - self.reserved_bytes

    @property
    def over(self) -> bool:
        return self.reserved_bytes > self.pool.capacity_bytes

    def describe(self, devices: Iterable[str] = ()) -> str:
        shared = f", shared by {', '.join(devices)}" if devices else ""
        parts = " + ".join(f"{r.owner} on {r.device} {format_bytes(r.total_bytes)}" for r in self.reservations)
        verdict = f"over by {format_bytes(-self.free_bytes)}" if self.over else f"{format_bytes(self.free_bytes)} left"
        return (
            f"pool {self.pool.name} ({format_bytes(self.pool.capacity_bytes)} usable{shared}): "
            f"{parts or 'nothing reserved'} = {format_bytes(self.reserved_bytes)}, {verdict}"
        )


class LedgerRefusal(RuntimeError):
    def __init__(self, usage: PoolUsage, reservation: Reservation):
        self.usage = usage
        self.reservation = reservation
        super().__init__(
            f"{reservation.owner} needs {format_bytes(reservation.total_bytes)} in pool {usage.pool.name}, "
            f"which has {format_bytes(max(0, usage.free_bytes))} left ({usage.describe()}); "
            "free memory elsewhere or lower the reservation"
        )


class SharedRamLedger:
    """Reservations by pool. Used from one thread (the planner or the orchestrator's loop)."""

    def __init__(self, pools: Iterable[MemoryPool]):
        self._pools = {p.name: p for p in pools}
        self._entries: dict[str, Reservation] = {}

    def _check_pool(self, reservation: Reservation) -> None:
        if reservation.pool not in self._pools:
            raise KeyError(f"{reservation.owner} reserves in pool {reservation.pool!r}; known pools: {', '.join(self._pools)}")
        if reservation.owner in self._entries:
            raise ValueError(f"{reservation.owner} already holds a reservation; release it first")

    def record(self, reservation: Reservation) -> None:
        """Book a reservation even if it overruns its pool (planning)."""
        self._check_pool(reservation)
        self._entries[reservation.owner] = reservation

    def reserve(self, reservation: Reservation) -> None:
        """Book a reservation, or raise LedgerRefusal if its pool cannot hold it."""
        self._check_pool(reservation)
        usage = self.usage(reservation.pool)
        if reservation.total_bytes > usage.free_bytes:
            raise LedgerRefusal(usage, reservation)
        self._entries[reservation.owner] = reservation

    def release(self, owner: str) -> Reservation | None:
        return self._entries.pop(owner, None)

    def usage(self, pool: str) -> PoolUsage:
        return PoolUsage(self._pools[pool], tuple(r for r in self._entries.values() if r.pool == pool))

    def pools(self) -> list[PoolUsage]:
        return [self.usage(name) for name in self._pools]

    def overruns(self) -> list[PoolUsage]:
        return [u for u in self.pools() if u.over]

    @property
    def reservations(self) -> list[Reservation]:
        return list(self._entries.values())
