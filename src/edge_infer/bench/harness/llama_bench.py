"""pp/tg with `llama-bench` semantics, shared by both engines' arms.

An engine supplies one function, `generate(prompt_ids, n_tokens) -> seconds`:
process the prompt, then greedily produce `n_tokens` tokens (end-of-sequence
ignored), and return the wall time. Everything else — the prompts, the
warm-up, the repetitions and the arithmetic — lives here, so that
edge-infer and llama.cpp are measured by the same code:

- pp: one `pp`-token prompt, one token out: ``pp_tps = pp / t_pp``.
- tg: a one-token prompt and `tg` tokens out, minus the same prompt with one
  token out, which removes the one-token prefill: ``tg_tps = (tg - 1) /
  (t_tg - t_1)``.
- Prompts are random token ids (seeded, so both engines see the same ones);
  every repetition starts from an empty context (no prefix reuse).
- `pp_tps` / `tg_tps` are the best repetition (the least disturbed one);
  the medians and every raw time are reported beside them.
"""
from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Callable

@dataclass(frozen=True)
class Timed:
    """One generation: seconds to its whole output, and of those the ones after its first token."""
    total_s: float
    after_first_s: float


GenerateFn = Callable[[list[int], int], Timed]


@dataclass(frozen=True)
class PpTgSettings:
    pp: int = 512
    tg: int = 128
    reps: int = 3
    seed: int = 0
    depth: int = 0  # tokens of context before the decode test (llama-bench's -d, for tg only)

    def validate(self) -> None:
        if self.depth < 0:
            raise ValueError(f"--depth must be 0 or more, got {self.depth}")
        if self.pp < 1:
            raise ValueError(f"--pp must be at least 1, got {self.pp}")
        if self.tg < 2:
            raise ValueError(f"--tg must be at least 2 (the rate is taken after the first token), got {self.tg}")
        if self.reps < 1:
            raise ValueError(f"--reps must be at least 1, got {self.reps}")

    @property
    def context_tokens(self) -> int:
        """Context one sequence needs: the longer of the two tests."""
        return max(self.pp + 1, self.depth + self.tg + 1)


@dataclass(frozen=True)
class RepTimes:
    pp_s: float
    tg_s: float  # the whole tg generation, its prompt's prefill included
    tg_decode_s: float  # its tg - 1 steps after the first token


def add_pp_tg_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("pp/tg (llama-bench semantics)")
    g.add_argument("--pp", type=int, default=512, help="prompt tokens of the prefill test (default 512)")
    g.add_argument("--tg", type=int, default=128, help="tokens generated in the decode test (default 128)")
    g.add_argument("--reps", type=int, default=3, help="repetitions; the best and the median are reported (default 3)")
    g.add_argument("--seed", type=int, default=0, help="seed of the random prompt token ids (default 0)")
    g.add_argument("--depth", type=int, default=0, metavar="D",
                   help="decode after D tokens of context (llama-bench's -d, here for the tg test only): its prompt "
                        "is D + 1 tokens, prefilled before the first token, out of the rate (default 0)")


def settings_from(args: argparse.Namespace) -> PpTgSettings:
    s = PpTgSettings(pp=args.pp, tg=args.tg, reps=args.reps, seed=args.seed, depth=args.depth)
    s.validate()
    return s


def prompt_ids(n: int, vocab_size: int, seed: int, rep: int, test: str) -> list[int]:
    """Random token ids, the same for every engine given the same arguments."""
    rng = random.Random(f"{seed}:{rep}:{test}")
    return [rng.randrange(vocab_size) for _ in range(n)]


def measure(generate: GenerateFn, vocab_size: int, s: PpTgSettings) -> list[RepTimes]:
    """Warm up once, then time `reps` repetitions of pp and tg. tg's rate comes from the steps after its first
    token within the one generation, so its prompt (1 + depth tokens) and that prompt's timing noise stay out."""
    generate(prompt_ids(s.pp, vocab_size, s.seed, -1, "pp"), 1)
    generate(prompt_ids(1 + s.depth, vocab_size, s.seed, -1, "tg"), 2)
    reps = []
    for rep in range(s.reps):
        pp = generate(prompt_ids(s.pp, vocab_size, s.seed, rep, "pp"), 1)
        tg = generate(prompt_ids(1 + s.depth, vocab_size, s.seed, rep, "tg"), s.tg)
        reps.append(RepTimes(pp.total_s, tg.total_s, tg.after_first_s))
    return reps


def rates(reps: list[RepTimes], s: PpTgSettings) -> dict[str, Any]:
    """The metrics (best and median rates) and the raw times behind them.

    tg_tps is (tg - 1) / the time after the first token. A repetition with no
    time after its first token (a clock too coarse) cannot give a rate; it is
    counted, not turned into infinity, and a run where none gives one is an error.
    """
    pp_rates = [s.pp / r.pp_s for r in reps]
    tg_rates = [(s.tg - 1) / r.tg_decode_s for r in reps if r.tg_decode_s > 0]
    if not tg_rates:
        raise ValueError(
            f"no repetition spent any time after its first of {s.tg} tokens, so no decode rate can be computed; raise --tg"
        )
    out: dict[str, Any] = {
        "pp_tps": round(max(pp_rates), 3),
        "pp_median_tps": round(statistics.median(pp_rates), 3),
        "tg_tps": round(max(tg_rates), 3),
        "tg_median_tps": round(statistics.median(tg_rates), 3),
    }
    out["raw"] = {
        "reps": [asdict(r) for r in reps],
        "pp_tps": [round(x, 3) for x in pp_rates],
        "tg_tps": [round(x, 3) for x in tg_rates],
        "tg_reps_without_rate": len(reps) - len(tg_rates),
    }
    return out
