"""Helpers shared by the runtime tests (a unique module name, imported through tests/runtime on sys.path)."""
import asyncio
import shutil
import textwrap
import threading
import time
from pathlib import Path

from edge_infer.runtime.transport import list_segments
from runtime import toys


class LoopThread:
    """An event loop on its own thread, so a pipeline can outlive one test."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def write_config(directory: Path, text: str, name: str = "deploy.yaml") -> Path:
    """Write a deploy config beside copies of the toy configs: `base_config: toy_speech.yaml` finds them."""
    for toy in (toys.TOY_TEXT, toys.TOY_SPEECH):
        shutil.copy(toy, directory / toy.name)
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def wait_until(predicate, timeout=30.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def segments_of(omni) -> list[str]:
    return list_segments(omni._orchestrator.prefix)


async def collect(omni, prompt, **kwargs):
    return [event async for event in omni.generate(prompt, **kwargs)]
