from __future__ import annotations

import json

import pytest

from edge_infer.bench.harness.grid import rotation
from edge_infer.hardware.cpu import FEATURES, MASK_ENV, detect

from .conftest import code_arm, metrics_arm


def test_rotation_starts_each_pass_one_arm_later():
    assert [rotation(3, p) for p in (1, 2, 3, 4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]


def test_arms_run_in_rotated_order(tmp_path, write_spec, grid):
    log = tmp_path / "order.log"
    arms = [
        code_arm(tag, f"import json; open({str(log)!r}, 'a').write({tag!r}); print(json.dumps({{'step_ms': 1.0}}))")
        for tag in "ABC"
    ]
    rc, result = grid(write_spec(arms), "--passes", "3")
    assert rc == 0
    assert log.read_text() == "ABC" "BCA" "CAB"
    recorded = [(o.pass_index, o.position, o.arm) for o in result.observations]
    assert recorded == [
        (1, 1, "A"), (1, 2, "B"), (1, 3, "C"),
        (2, 1, "B"), (2, 2, "C"), (2, 3, "A"),
        (3, 1, "C"), (3, 2, "A"), (3, 3, "B"),
    ]


def test_best_follows_each_metrics_direction(write_spec, grid):
    arm = metrics_arm("A", {"tg_tps": [10.0, 12.0, 11.0], "rss_anon_mb": [300.0, 280.0, 290.0],
                            "score": [1.0, 3.0, 2.0], "widgets": [5.0, 7.0, 6.0]})
    rc, result = grid(write_spec([arm]), "--direction", "score=max")
    assert rc == 0
    tps, rss, score, widgets = (result.row("A", m) for m in ("tg_tps", "rss_anon_mb", "score", "widgets"))
    assert (tps.direction, tps.best, tps.median) == ("max", 12.0, 11.0)
    assert (rss.direction, rss.best, rss.median) == ("min", 280.0, 290.0)
    assert (score.direction, score.best) == ("max", 3.0)  # explicit override
    # An unknown name gets no direction and no best, and the user is told how to give one.
    assert widgets.direction is None and widgets.best is None and widgets.median == 6.0
    assert any(f.kind == "NO_DIRECTION" and "--direction widgets=" in f.message for f in result.flags)
    assert tps.spread_pct == pytest.approx((12 - 10) / 11 * 100, rel=1e-3)


def test_direction_override_flips_best(write_spec, grid):
    rc, result = grid(write_spec([metrics_arm("A", {"tg_tps": [10.0, 12.0, 11.0]})]), "--direction", "tg_tps=min")
    assert result.row("A", "tg_tps").best == 10.0


def test_spec_gives_directions_and_the_command_line_wins(write_spec, grid):
    arm = metrics_arm("A", {"mean_kl": [0.3, 0.1, 0.2], "score": [1.0, 3.0, 2.0]})
    spec = write_spec([arm], directions={"mean_kl": "min", "score": "min"})
    rc, result = grid(spec, "--direction", "score=max")
    assert rc == 0
    assert (result.row("A", "mean_kl").direction, result.row("A", "mean_kl").best) == ("min", 0.1)
    assert (result.row("A", "score").direction, result.row("A", "score").best) == ("max", 3.0)
    assert not any(f.kind == "NO_DIRECTION" for f in result.flags)
    rc, _ = grid(write_spec([arm], directions={"mean_kl": "lower"}))
    assert rc != 0  # a direction other than max/min is a spec error


def test_noisy_arm_is_flagged(write_spec, grid):
    rc, result = grid(write_spec([metrics_arm("A", {"step_ms": [10.0, 12.0, 10.0]})]))
    noisy = [f for f in result.flags if f.kind == "NOISY"]
    assert noisy and noisy[0].arm == "A" and noisy[0].metric == "step_ms"
    rc, result = grid(write_spec([metrics_arm("A", {"step_ms": [10.0, 12.0, 10.0]})]), "--noise-threshold", "25")
    assert not [f for f in result.flags if f.kind == "NOISY"]


def test_single_pass_is_not_a_result(write_spec, grid, capsys):
    rc, result = grid(write_spec([metrics_arm("A", {"step_ms": [10.0]})]), "--passes", "1")
    out = capsys.readouterr().out
    assert "n=1: not a result" in out
    assert any(f.kind == "SINGLE_PASS" for f in result.flags)
    assert any(f.kind == "FEW_PASSES" for f in result.flags)


def test_arms_within_spread_are_not_ranked(write_spec, grid, capsys):
    arms = [metrics_arm("A", {"tg_tps": [10.0, 10.5, 10.2]}), metrics_arm("B", {"tg_tps": [10.3, 10.1, 10.6]})]
    rc, result = grid(write_spec(arms, metric="tg_tps"))
    assert "not a ranking" in capsys.readouterr().out
    assert result.ranking.startswith("not a ranking")
    assert any(f.kind == "NOT_A_RANKING" for f in result.flags)


def test_clear_gap_is_ranked_in_the_metrics_direction(write_spec, grid):
    arms = [metrics_arm("fast", {"ready_s": [1.0, 1.01, 1.02]}), metrics_arm("slow", {"ready_s": [2.0, 2.02, 2.01]})]
    rc, result = grid(write_spec(arms), "--metric", "ready_s")
    assert result.ranking.startswith("fast leads slow")
    assert not any(f.kind == "NOT_A_RANKING" for f in result.flags)


def test_failed_passes_are_kept_with_their_error(write_spec, grid, capsys):
    arms = [
        metrics_arm("good", {"tg_tps": [5.0]}),
        code_arm("crash", "import sys; sys.stderr.write('out of memory while loading\\n'); sys.exit(3)"),
        code_arm("silent", "print('no json here')"),
        code_arm("slow", "import time; time.sleep(30)"),
        code_arm("wrong", "print('{\"other\": 1}')"),
    ]
    rc, result = grid(write_spec(arms, metric="tg_tps"), "--passes", "1", "--timeout", "1")
    assert rc == 1
    by_arm = {o.arm: o for o in result.observations}
    assert len(result.observations) == 5  # nothing dropped
    assert (by_arm["crash"].status, by_arm["crash"].exit_code) == ("failed", 3)
    assert "out of memory while loading" in by_arm["crash"].stderr_tail
    assert by_arm["silent"].status == "error" and "no JSON object" in by_arm["silent"].error
    assert by_arm["slow"].status == "timeout" and by_arm["slow"].exit_code is None
    assert by_arm["wrong"].status == "error" and "tg_tps" in by_arm["wrong"].error
    # A failed arm has a row with no value, not a zero.
    crash_row = result.row("crash", "tg_tps")
    assert crash_row.n == 0 and crash_row.median is None
    out = capsys.readouterr().out
    assert "crash, pass 1 (position 2): failed: exit code 3" in out
    assert "out of memory while loading" in out
    assert {f.arm for f in result.flags if f.kind == "NO_RESULT"} == {"crash", "silent", "slow", "wrong"}


def test_arms_are_pinned_and_get_their_env(write_spec, grid, core, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    arm = code_arm(
        "A",
        "import json, os; print(json.dumps({'cores_seen': len(os.sched_getaffinity(0)), 'knob_len': len(os.environ['KNOB'])}))",
        env={"KNOB": "abcd"},
    )
    rc, result = grid(write_spec([arm]), "--cores", str(core), "--direction", "cores_seen=min", "--direction", "knob_len=min")
    assert rc == 0
    assert result.row("A", "cores_seen").values == [1.0, 1.0, 1.0]
    assert result.row("A", "knob_len").median == 4.0
    p = result.provenance
    assert p.target_cores == [core] and p.thread_env["OMP_NUM_THREADS"] == "1"
    assert p.arms[0].env == {"KNOB": "abcd"} and p.arms[0].command == arm["command"]
    assert p.host and p.cpu_count and p.started_at and p.finished_at and p.argv


def test_keys_restrict_and_require_metrics(write_spec, grid):
    arm = metrics_arm("A", {"tg_tps": [5.0], "rss_mb": [10.0], "pp_tps": [50.0]})
    rc, result = grid(write_spec([arm]), "--keys", "tg_tps,rss_mb")
    assert result.metrics() == ["tg_tps", "rss_mb"]
    rc, result = grid(write_spec([arm]), "--keys", "tg_tps,absent_ms")
    assert rc == 1 and all(o.status == "error" and "absent_ms" in o.error for o in result.observations)


def test_a_string_command_runs_through_the_shell(write_spec, grid):
    arm = {"tag": "sh", "command": "echo start && echo '{\"step_ms\": 2}'"}
    rc, result = grid(write_spec([arm]))
    assert rc == 0 and result.row("sh", "step_ms").median == 2.0


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"arms": []}, "no arms"),
        ({"arms": [{"tag": "A", "command": "true"}, {"tag": "A", "command": "true"}]}, "repeated: A"),
        ({"arms": [{"tag": "A"}]}, "arms.0.command"),
        ({"arms": [{"tag": "A", "command": "true", "enviroment": {}}]}, "enviroment"),
    ],
)
def test_invalid_spec_is_refused_with_the_reason(tmp_path, grid, capsys, spec, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec))
    rc, result = grid(path)
    assert rc == 2 and result is None
    assert message in capsys.readouterr().err


def test_cores_outside_affinity_are_refused(write_spec, grid, capsys):
    rc, _ = grid(write_spec([metrics_arm("A", {"step_ms": [1.0]})]), "--cores", "4096")
    assert rc == 2 and "not available" in capsys.readouterr().err


def test_spec_cores_may_be_a_list(write_spec, grid, core):
    rc, result = grid(write_spec([metrics_arm("A", {"step_ms": [1.0]})], cores=[core]), "--passes", "1")
    assert result.settings.cores == [core] and result.provenance.target_cores == [core]


def test_an_arm_masked_to_a_level_this_cpu_lacks_is_refused_before_any_pass(write_spec, grid, capsys):
    cpu = detect()
    absent = [f for f in FEATURES[cpu.arch] if f not in cpu.features]
    if not absent:
        pytest.skip("this CPU has every feature the capability model names, so no mask can ask for more")
    arms = [metrics_arm("native", {"step_ms": [1.0]}), metrics_arm("higher", {"step_ms": [1.0]}, {MASK_ENV: absent[0]})]
    rc, result = grid(write_spec(arms), "--passes", "1")
    err = capsys.readouterr().err
    assert rc == 2 and result is None
    assert f"arm 'higher' runs as {MASK_ENV}={absent[0]}, but this CPU lacks {absent[0]}" in err
