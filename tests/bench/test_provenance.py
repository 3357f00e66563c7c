"""Provenance says whether what was measured is a clean tree."""
from __future__ import annotations

import subprocess

from edge_infer.bench.harness.provenance import git_state


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_results_written_by_earlier_grids_do_not_make_the_tree_dirty(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "engine.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "old.json").write_text("{}\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")

    (tmp_path / "benchmarks" / "results" / "old.json").write_text('{"new": 1}\n')
    (tmp_path / "benchmarks" / "results" / "new.json").write_text("{}\n")
    assert git_state(tmp_path / "benchmarks").dirty is False

    (tmp_path / "engine.py").write_text("x = 2\n")
    assert git_state(tmp_path / "benchmarks").dirty is True
