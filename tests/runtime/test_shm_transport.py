import numpy as np
import pytest

from edge_infer.runtime.contracts import Payload
from edge_infer.runtime.transport import (
    OutboundBuffers,
    TransportError,
    list_segments,
    receive,
    sweep_stale_pipelines,
    unlink_segment,
    _open,
)


def pcm(n):
    return Payload("pcm_audio/1", np.linspace(-1, 1, n, dtype=np.float32), {"sample_rate": 24000, "channels": 1})


@pytest.fixture
def buffers(request):
    out = OutboundBuffers(f"eitest{request.node.name[-12:]}_", inline_threshold_bytes=64, max_unacked=2)
    yield out
    out.release_all()


def test_small_payloads_travel_inline_and_large_ones_through_a_segment(buffers):
    small, large = buffers.export(pcm(16)), buffers.export(pcm(1000))
    assert small.inline is not None and small.segment is None
    assert large.segment in list_segments(buffers.prefix)
    copy = receive(large)
    assert np.array_equal(copy.data, pcm(1000).data) and copy.metadata == {"sample_rate": 24000, "channels": 1}
    assert receive(large).data.shape == (1000,)  # a second consumer reads the same segment


def test_segment_lives_until_released_and_credit_returns(buffers):
    a, b = buffers.export(pcm(1000)), buffers.export(pcm(1000))
    assert not buffers.can_send  # two unacknowledged: the producer must wait
    receive(a)  # a consumer copying it out does not free it
    assert a.segment in list_segments(buffers.prefix)
    buffers.release([a.seq])
    assert a.segment not in list_segments(buffers.prefix) and b.segment in list_segments(buffers.prefix)
    assert buffers.can_send
    with pytest.raises(TransportError, match="is gone"):
        receive(a)


def test_release_all_leaves_nothing(buffers):
    for _ in range(2):
        buffers.export(pcm(500))
    buffers.release_all()
    assert list_segments(buffers.prefix) == []


def test_stale_pipeline_segments_are_swept():
    name = "ei999999999x0abc_s0g0_1"  # no process has this pid
    shm = _open(name, create=True, size=16)
    shm.close()
    try:
        assert name in sweep_stale_pipelines()
        assert name not in list_segments("ei999999999x")
    finally:
        unlink_segment(name)
