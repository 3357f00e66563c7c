import sys
from pathlib import Path

import pytest

# tts_helpers.py is shared by the speech tests; make it importable whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).parent))

from testutil import LoopThread  # noqa: E402


@pytest.fixture(scope="module")
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.close()
