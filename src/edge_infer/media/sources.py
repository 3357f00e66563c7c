"""Where a request's media bytes come from: data: URLs, file:// under an allowed directory, http(s) if allowed.

The operator decides (MediaPolicy): local files are read only under
``--allowed-media-dir`` (after resolving symlinks and ``..``), remote URLs only
with ``--allow-remote-media``; every source is capped at ``max_bytes`` and remote
reads at ``timeout_s`` in all (checked as bytes arrive; a connection that stalls
completely is cut by the socket timeout, so the worst case is twice it).
"""
from __future__ import annotations

import base64
import binascii
import os
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from edge_infer.errors import MediaError

ALLOWED_DIR_FLAG = "--allowed-media-dir"
REMOTE_FLAG = "--allow-remote-media"
MAX_BYTES_FLAG = "--max-media-bytes"
_CHUNK = 1 << 16


@dataclass(frozen=True)
class MediaPolicy:
    """What the operator allows a request to point at."""

    allowed_dir: Path | None = None  # file:// only under it
    allow_remote: bool = False  # http(s) only when set
    max_bytes: int = 20 << 20
    timeout_s: float = 10.0


def read_source(url: str, policy: MediaPolicy, *, part: str = "media") -> bytes:
    """The bytes `url` names, if the policy allows reading them; MediaError (naming `part`) otherwise."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return _data_url(url, policy, part)
    if scheme == "file":
        return _local_file(url, policy, part)
    if scheme in ("http", "https"):
        return _remote(url, policy, part)
    raise MediaError(f"{part}: the URL {_short(url)} has no scheme edge-infer reads; "
                     "send a data: URL (base64), a file:// path or an http(s):// URL")


def decode_base64(text: str, policy: MediaPolicy, *, part: str = "media") -> bytes:
    """Standard base64 (line breaks allowed), refused before decoding when it would exceed max_bytes."""
    compact = "".join(text.split())
    size = len(compact) * 3 // 4 - compact[-2:].count("=")  # the decoded length, before decoding
    if size > policy.max_bytes:
        _too_big(part, f"{size} bytes", policy)
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaError(f"{part}: the data is not valid base64 ({exc}); encode the file with standard base64") from None


def _data_url(url: str, policy: MediaPolicy, part: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep:
        raise MediaError(f"{part}: the data: URL has no ',' before its data; use data:<type>;base64,<data>")
    if not header.lower().endswith(";base64"):
        raise MediaError(f"{part}: the data: URL is not base64 ({_short(header)}); use data:<type>;base64,<data>")
    return decode_base64(payload, policy, part=part)


def _local_file(url: str, policy: MediaPolicy, part: str) -> bytes:
    if policy.allowed_dir is None:
        raise MediaError(f"{part}: file:// URLs are off; the server reads local files only under a directory "
                         f"the operator allows ({ALLOWED_DIR_FLAG} DIR)")
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise MediaError(f"{part}: file:// URL names host {parsed.netloc!r}; only local paths (file:///path) are read")
    allowed = Path(policy.allowed_dir).resolve()
    given = urllib.parse.unquote(parsed.path)
    if not given.startswith("/"):
        raise MediaError(f"{part}: {_short(url)} is not an absolute path; use file:///absolute/path")
    try:
        path = Path(given).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a symlink loop, a NUL byte
        raise MediaError(f"{part}: {_short(url)} does not exist") from None
    if not path.is_relative_to(allowed):
        raise MediaError(f"{part}: {_short(url)} is outside the allowed media directory {allowed} "
                         f"({ALLOWED_DIR_FLAG}); put the file there")
    try:
        # O_NOFOLLOW: the path was checked with its symlinks resolved; a link swapped in since is refused.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise MediaError(f"{part}: {_short(url)} cannot be read ({exc.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise MediaError(f"{part}: {_short(url)} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > policy.max_bytes:
            _too_big(part, f"{info.st_size} bytes", policy)
        return _capped(f.read, part, policy, deadline=None)


class _HttpRedirectsOnly(urllib.request.HTTPRedirectHandler):
    """Follow redirects only to http(s): urllib would otherwise follow one to ftp://."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlparse(newurl).scheme not in ("http", "https"):
            raise urllib.error.URLError(f"it redirects to {_short(newurl)}, and only http(s) redirects are followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _remote(url: str, policy: MediaPolicy, part: str) -> bytes:
    if not policy.allow_remote:
        raise MediaError(f"{part}: remote media URLs are off; send the file as a data: URL, or start the server "
                         f"with {REMOTE_FLAG} to let it fetch http(s) URLs")
    opener = urllib.request.build_opener(_HttpRedirectsOnly())
    deadline = time.monotonic() + policy.timeout_s
    request = urllib.request.Request(url, headers={"User-Agent": "edge-infer"})
    try:
        with opener.open(request, timeout=policy.timeout_s) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > policy.max_bytes:
                _too_big(part, f"{length} bytes", policy)
            # read1 returns what has arrived, so the deadline is checked however slowly bytes trickle in.
            return _capped(response.read1, part, policy, deadline=deadline)
    except MediaError:
        raise
    except urllib.error.HTTPError as exc:
        raise MediaError(f"{part}: fetching {_short(url)} failed with HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise MediaError(f"{part}: fetching {_short(url)} failed ({reason})") from None


def _capped(read, part: str, policy: MediaPolicy, deadline: float | None) -> bytes:
    """Read to the end, refusing more than max_bytes, or (remote) reading past the deadline."""
    chunks, total = [], 0
    while chunk := read(_CHUNK):
        total += len(chunk)
        if total > policy.max_bytes:
            _too_big(part, f"more than {policy.max_bytes} bytes", policy)
        if deadline is not None and time.monotonic() > deadline:
            raise MediaError(f"{part}: the download took longer than {policy.timeout_s:g} s; "
                             "send a smaller file or a data: URL")
        chunks.append(chunk)
    return b"".join(chunks)


def _too_big(part: str, amount: str, policy: MediaPolicy) -> None:
    raise MediaError(f"{part}: {amount} is above the limit of {policy.max_bytes} bytes per media item "
                     f"({MAX_BYTES_FLAG}); send a smaller file or raise {MAX_BYTES_FLAG}")


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
