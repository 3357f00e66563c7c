"""Helpers shared by the runtime tests (a unique module name, imported through tests/runtime on sys.path)."""
import shutil
import textwrap
from pathlib import Path

from edge_infer.runtime.transport import list_segments
from runtime import toys


def write_config(directory: Path, text: str, name: str = "deploy.yaml") -> Path:
    """Write a deploy config beside copies of the toy configs: `base_config: toy_speech.yaml` finds them."""
    for toy in (toys.TOY_TEXT, toys.TOY_SPEECH):
        shutil.copy(toy, directory / toy.name)
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def segments_of(omni) -> list[str]:
    return list_segments(omni._orchestrator.prefix)


async def collect(omni, prompt, **kwargs):
    return [event async for event in omni.generate(prompt, **kwargs)]
