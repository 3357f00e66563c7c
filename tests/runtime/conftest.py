import sys
from pathlib import Path

import pytest

# The runtime tests share omni_helpers.py; make it importable whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).parent))

from testutil import LoopThread  # noqa: E402


@pytest.fixture(scope="module")
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.close()
