"""The weight bytes a decode step reads: what the bandwidth-use figure of `bench pp-tg` divides by."""
from __future__ import annotations

import pytest

from edge_infer.config import QuantConfig


@pytest.mark.parametrize("quant", [None, QuantConfig(group_size=32), QuantConfig(group_size=32, quantize_head=True)],
                         ids=["bf16", "int4", "int4-head"])
@pytest.mark.parametrize("family", ["tied", "untied"])
def test_decode_reads_every_resident_weight_but_one_row_of_a_table_the_head_does_not_share(
    tied_model, untied_model, make_core, quant, family
):
    core = make_core(tied_model if family == "tied" else untied_model, quant)
    model, info = core.model, core.ready_info
    if family == "tied":  # the head reads the table, or the lookup reads the quantized head: all of it is read
        assert info.decode_read_bytes == info.weight_bytes
    else:  # a step looks up one row of the table
        rows, width = model.embed.shape
        assert info.weight_bytes - info.decode_read_bytes == (rows - 1) * width * model.embed.element_size()
