"""`edge-infer bench kernels --kernel`: a subset of the kernels, at the shape and rows asked for."""
from __future__ import annotations

import json

from edge_infer.cli import main

TINY = ["bench", "kernels", "--rows", "64", "--cols", "128", "--m", "3", "--passes", "1", "--min-time", "0.001",
        "--num-threads", "1"]


def test_only_the_named_kernels_are_measured(capsys):
    assert main([*TINY, "--kernel", "dense"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {(c["kernel"], c["m"]) for c in result["cases"]} == {("dense", 3)}
    assert {c["dtype"] for c in result["cases"]} == {"float32", "bfloat16"}
    assert result["shape"] == [64, 128] and result["dense_float32_m3_gmult_per_s"] > 0


def test_a_kernel_this_cpu_does_not_run_is_named_with_those_it_does(capsys):
    assert main([*TINY, "--kernel", "cpu-w4a8[sve]"]) == 2
    err = capsys.readouterr().err
    assert "--kernel cpu-w4a8[sve]: this CPU runs" in err and "dense" in err and "cpu-int4" in err
