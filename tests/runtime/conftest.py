import pytest

from omni_helpers import LoopThread


@pytest.fixture(scope="module")
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.close()
