"""Local files as chat content parts for the CLI (chat, generate): data: URLs, the parts the server takes."""
from __future__ import annotations

import base64
import mimetypes
from pathlib import Path
from typing import Any

# Each kind of attachment and its content part (vLLM's audio_url takes any audio file as a URL).
PART_TYPES = {"image": "image_url", "audio": "audio_url", "video": "video_url"}


def file_part(kind: str, path: str | Path) -> dict[str, Any]:
    """The content part sending the file at ``path`` as a ``kind`` (image, audio, video); ValueError if unreadable."""
    path = Path(path).expanduser()
    try:
        data = base64.b64encode(path.read_bytes()).decode()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    part_type = PART_TYPES[kind]
    return {"type": part_type, part_type: {"url": f"data:{mime};base64,{data}"}}
