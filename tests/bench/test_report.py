from __future__ import annotations

import json
import sys

import pytest

from edge_infer.cli import main

from .conftest import FAST, code_arm, metrics_arm


@pytest.fixture(scope="module")
def result_file(tmp_path_factory):
    """One grid result shared by this module's tests (they only read it)."""
    directory = tmp_path_factory.mktemp("report")
    arms = [
        metrics_arm("control", {"tg_tps": [10.0, 10.2, 10.1], "rss_anon_mb": [400.0, 401.0, 400.5]}),
        metrics_arm("int4", {"tg_tps": [15.0, 15.3, 15.1], "rss_anon_mb": [200.0, 200.5, 200.2]}),
        code_arm("broken", "import sys; sys.exit(7)"),
    ]
    spec = directory / "spec.json"
    spec.write_text(json.dumps({"arms": arms, "metric": "tg_tps"}))
    out = directory / "result.json"
    main(["bench", "grid", "--spec", str(spec), *FAST, "--no-lock", "--out", str(out)])
    return out


def test_report_tabulates_each_arm(result_file, capsys):
    assert main(["bench", "report", str(result_file)]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| int4")]
    assert any("tg_tps" in line and "15.1" in line and "| 3 " in line for line in table)
    assert any(line.startswith("| broken") and "no result" in line and "failed 3/3" in line for line in out.splitlines())
    assert "broken, pass 1 (position 3): failed: exit code 7" in out
    assert "Plots skipped: no --out directory" in out


def test_control_gives_ratios(result_file, capsys):
    assert main(["bench", "report", str(result_file), "--control", "control"]) == 0
    out = capsys.readouterr().out
    assert "vs control" in out
    int4_tps = next(line for line in out.splitlines() if line.startswith("| int4") and "tg_tps" in line)
    assert "1.5×" in int4_tps  # 15.1 / 10.1
    int4_rss = next(line for line in out.splitlines() if line.startswith("| int4") and "rss_anon_mb" in line)
    assert "0.5×" in int4_rss  # 200.2 / 400.5


def test_unknown_control_is_refused(result_file, capsys):
    assert main(["bench", "report", str(result_file), "--control", "nope"]) == 2
    assert "arms: control, int4, broken" in capsys.readouterr().err


def test_a_file_that_is_not_a_result_is_refused(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text('{"tg_tps": 3}')
    assert main(["bench", "report", str(other)]) == 2
    assert "not an `edge-infer bench grid` result" in capsys.readouterr().err


def test_report_writes_markdown_and_plots(result_file, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    assert main(["bench", "report", str(result_file), "--out", str(out)]) == 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["result-rss_anon_mb.png", "result-tg_tps.png"]
    assert all((out / p).read_bytes().startswith(b"\x89PNG") for p in pngs)
    assert "![tg_tps](result-tg_tps.png)" in (out / "report.md").read_text()


def test_without_matplotlib_plots_are_skipped_with_the_reason(result_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    out = tmp_path / "report"
    assert main(["bench", "report", str(result_file), "--out", str(out)]) == 0
    assert not list(out.glob("*.png"))
    text = (out / "report.md").read_text()
    assert "Plots skipped: matplotlib is not importable" in text and "edge-infer[plots]" in text
