"""Running tasks on fresh simulated phones, and the per-task report.

Each run of a task gets a new phone in the task's start state; the oracle
compares the phone before and after. The report gives, per task (variants
folded into their task, and each variant on its own): pass rate, falsely
claimed done, collateral damage, steps, tokens and wall time.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Callable

from edge_infer.agent.chat import ChatModel
from edge_infer.agent.loop import AgentConfig, run_episode
from edge_infer.agent.tasks import Outcome, Task, score


def run_task(task: Task, config: AgentConfig, model: ChatModel | None = None) -> Outcome:
    device = task.device()
    before = device.phone_state()
    episode = run_episode(device, task.prompt, config, model)
    return score(task, episode, before, device.phone_state())


def run_suite(tasks: list[Task], config: AgentConfig, runs: int = 1, model: ChatModel | None = None,
              progress: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
    """Every task ``runs`` times, interleaved (all tasks once, then again), so drift spreads over all of them."""
    outcomes = []
    for run in range(1, runs + 1):
        for task in tasks:
            outcome = run_task(task, config, model)
            outcomes.append(outcome)
            if progress:
                progress(run, outcome)
    return outcomes


@dataclass(frozen=True)
class TaskReport:
    task: str
    runs: int
    passed: int
    false_claims: int
    collateral: int  # runs with any collateral damage
    errors: int  # runs the server failed
    mean_steps: float
    mean_tokens: float  # prompt + completion, per run
    mean_wall_s: float

    @property
    def pass_rate(self) -> float:
        return self.passed / self.runs


def report(outcomes: list[Outcome], key: Callable[[Outcome], str] = lambda o: o.task) -> list[TaskReport]:
    groups: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        groups.setdefault(key(outcome), []).append(outcome)
    return [
        TaskReport(
            task=name, runs=len(group), passed=sum(o.success for o in group),
            false_claims=sum(o.false_claim for o in group), collateral=sum(bool(o.collateral) for o in group),
            errors=sum(o.error is not None for o in group),
            mean_steps=round(statistics.mean(o.steps for o in group), 2),
            mean_tokens=round(statistics.mean(o.prompt_tokens + o.completion_tokens for o in group), 1),
            mean_wall_s=round(statistics.mean(o.wall_s for o in group), 3),
        )
        for name, group in groups.items()
    ]


def by_base_task(outcome: Outcome) -> str:
    return outcome.task.partition("/")[0]


def table(reports: list[TaskReport]) -> str:
    lines = ["| task | passed | false claims | collateral | errors | steps | tokens | wall s |", "|---|---|---|---|---|---|---|---|"]
    for r in reports:
        lines.append(f"| {r.task} | {r.passed}/{r.runs} | {r.false_claims} | {r.collateral} | {r.errors} | "
                     f"{r.mean_steps:g} | {r.mean_tokens:g} | {r.mean_wall_s:.2f} |")
    return "\n".join(lines)


def metrics(outcomes: list[Outcome]) -> dict[str, float]:
    """Flat numbers for a benchmark grid: overall and per task (variants folded in), as fractions of runs."""
    out: dict[str, float] = {}
    for r in [*report(outcomes, lambda o: "all"), *report(outcomes, by_base_task)]:
        prefix = "" if r.task == "all" else f"{r.task}_"
        out[f"{prefix}pass_rate"] = round(r.pass_rate, 4)
        out[f"{prefix}false_claim_rate"] = round(r.false_claims / r.runs, 4)
        out[f"{prefix}collateral_rate"] = round(r.collateral / r.runs, 4)
    overall = report(outcomes, lambda o: "all")[0]
    out["steps_per_episode"] = overall.mean_steps
    out["episode_wall_s"] = overall.mean_wall_s
    return out


def as_json(outcomes: list[Outcome]) -> dict:
    return {
        "tasks": [asdict(r) | {"pass_rate": round(r.pass_rate, 4)} for r in report(outcomes)],
        "episodes": [asdict(o) for o in outcomes],
    }
