"""`edge-infer bench kernels --kernel`: a subset of the kernels, at the shape and rows asked for."""
from __future__ import annotations

import json

import pytest

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


def _integer_reference(x, weight):
    """The reference's own quantization, summed exactly in float64."""
    import torch

    w_scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
    x_scales = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
    sums = torch.round(x / x_scales).double() @ torch.round(weight / w_scales[:, None]).double().T
    return sums * x_scales.double() * w_scales.double()


def test_the_onednn_int8_reference_is_exact_where_it_is_offered(capsys):
    """Offered with VNNI or AMX-INT8, where its integer sums are exact; elsewhere oneDNN's 16-bit pair sums saturate
    (u8 x s8 pairs above 32,767), so it is neither offered nor measured."""
    import torch

    from edge_infer.bench.measures.kernels import OneDnnInt8Reference, onednn_int8_exact

    if not onednn_int8_exact():
        assert main([*TINY, "--kernel", OneDnnInt8Reference.name]) == 2
        assert f"--kernel {OneDnnInt8Reference.name}: this CPU runs" in capsys.readouterr().err
        pytest.skip("oneDNN's int8 products are exact with avx_vnni, avx512_vnni or amx_int8, which this CPU lacks")
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(96, 1000, generator=gen), torch.randn(37, 1000, generator=gen)
    x[:, 0] = 50.0  # every row's largest code 127 (shifted: 255) against weights up to 127: saturating pairs
    expected = _integer_reference(x, weight)
    got = OneDnnInt8Reference(weight, 37)(x).double()
    # exact integer sums (fp32 holds them to 2^24 here), then two fp32 scalings
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())
