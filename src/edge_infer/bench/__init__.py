"""`edge-infer bench`: how edge-infer measures itself, in three parts that import one way.

- ``harness``: the benchmark framework every arm shares: grid runs, statistics,
  checks, results, reports, archives, and the arm side (one JSON line,
  provenance, the boot clock, the pp/tg method of llama-bench).
- ``measures``: edge-infer's own measurements (pp-tg, init-memory, kernels,
  serve, transport, pipeline, tts, fidelity, reliability).
- ``baselines``: other engines measured the same way (llama.cpp).

``measures`` and ``baselines`` build on ``harness`` and not on each other
(an import-linter contract in pyproject.toml); ``cli.py`` is the subcommand table.
"""
