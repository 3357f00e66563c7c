"""Where a request's media bytes come from: data: URLs, file:// under an allowed directory, http(s) if allowed.

The operator decides (MediaPolicy): local files are read only under
``--allowed-media-dir`` (after resolving symlinks and ``..``), remote URLs only
with ``--allow-remote-media``; every source is capped at ``max_bytes`` and a remote
fetch at ``timeout_s`` in all: connecting (each address tried gets the time left),
headers and body (a timer shuts its sockets down then, however slowly a server
trickles; only name resolution is outside it, bounded by the resolver's own timeouts).
"""
from __future__ import annotations

import base64
import binascii
import http.client
import os
import socket
import stat
import threading
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


URL_SAFE = str.maketrans("-_", "+/")


def decode_base64(text: str, policy: MediaPolicy, *, part: str = "media") -> bytes:
    """Base64, refused before decoding when it would exceed max_bytes. Line breaks, missing padding and the URL-safe
    alphabet (- and _ for + and /) are taken, as browsers' atob and JavaScript encoders send them."""
    compact = "".join(text.split())
    if "+" not in compact and "/" not in compact:  # one alphabet or the other, not both
        compact = compact.translate(URL_SAFE)
    if len(compact) % 4 in (2, 3):  # padding left off
        compact += "=" * (4 - len(compact) % 4)
    size = len(compact) * 3 // 4 - compact[-2:].count("=")  # the decoded length, before decoding
    if size > policy.max_bytes:
        _too_big(part, f"{size:,} bytes", policy)
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
    outside = MediaError(f"{part}: {_short(url)} is outside the allowed media directory {allowed} "
                         f"({ALLOWED_DIR_FLAG}); put the file there")
    # Lexically first, before the file system is asked anything: what exists outside the directory is not
    # for a client to learn from which error it gets.
    lexical = Path(os.path.normpath(given))
    if not (lexical.is_relative_to(allowed) or lexical.is_relative_to(os.path.normpath(os.path.abspath(policy.allowed_dir)))):
        raise outside
    try:
        path = lexical.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a symlink loop, a NUL byte
        raise MediaError(f"{part}: {_short(url)} does not exist") from None
    if not path.is_relative_to(allowed):  # a symlink under the directory that points out of it
        raise outside
    try:
        # O_NOFOLLOW: the path was checked with its symlinks resolved; a link swapped in since is refused.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise MediaError(f"{part}: {_short(url)} cannot be read ({exc.strerror})") from None
    try:
        # What was opened, not what was checked: a directory on the path swapped for a link meanwhile is caught.
        if not _opened_path(fd, path).is_relative_to(allowed):
            raise outside
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MediaError(f"{part}: {_short(url)} is not a regular file")
        if info.st_size > policy.max_bytes:
            _too_big(part, f"{info.st_size:,} bytes", policy)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        return _capped(f.read, part, policy)


def _opened_path(fd: int, checked: Path) -> Path:
    """The path the kernel opened for ``fd`` (Linux's /proc); ``checked`` where there is no /proc."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return checked


class _HttpRedirectsOnly(urllib.request.HTTPRedirectHandler):
    """Follow redirects only to http(s): urllib would otherwise follow one to ftp://."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlparse(newurl).scheme not in ("http", "https"):
            raise urllib.error.URLError(f"it redirects to {_short(newurl)}, and only http(s) redirects are followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _Fetch:
    """One remote fetch's sockets, shut down when its deadline passes: a socket timeout bounds each read, not
    a server that sends its status line and headers a byte at a time."""

    def __init__(self, timeout_s: float):
        self.deadline = time.monotonic() + timeout_s
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> "_Fetch":
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()

    def opener(self) -> urllib.request.OpenerDirector:
        return urllib.request.build_opener(_TrackingHttp(self), _TrackingHttps(self), _HttpRedirectsOnly())

    def create_connection(self, address, timeout=None, source_address=None) -> socket.socket:
        """http.client's connect step: each of a host's addresses (and a TLS handshake after it) gets the time
        left, not timeout_s each; the socket is cut with the others from then on."""
        sock = socket.create_connection(address, max(self.deadline - time.monotonic(), 0.001), source_address)
        with self._lock:
            self._sockets.append(sock)
            if self.expired:  # connected just as the timer fired
                _shut(sock)
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


class _Tracking:
    """Mixed into urllib's handlers: their connections connect through the fetch."""

    def __init__(self, fetch: _Fetch):
        super().__init__()
        self.fetch = fetch

    def do_open(self, http_class, req, **kwargs):
        def connection(*args, **kw) -> http.client.HTTPConnection:
            conn = http_class(*args, **kw)
            conn._create_connection = self.fetch.create_connection  # what HTTPConnection.connect calls
            return conn

        return super().do_open(connection, req, **kwargs)


class _TrackingHttp(_Tracking, urllib.request.HTTPHandler):
    pass


class _TrackingHttps(_Tracking, urllib.request.HTTPSHandler):
    pass


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # a blocked read returns at once
    except OSError:
        pass


def _remote(url: str, policy: MediaPolicy, part: str) -> bytes:
    if not policy.allow_remote:
        raise MediaError(f"{part}: remote media URLs are off; send the file as a data: URL, or start the server "
                         f"with {REMOTE_FLAG} to let it fetch http(s) URLs")
    late = MediaError(f"{part}: the download took longer than {policy.timeout_s:g} s; send a smaller file or a data: URL")
    request = urllib.request.Request(url, headers={"User-Agent": "edge-infer"})
    with _Fetch(policy.timeout_s) as fetch:
        try:
            with fetch.opener().open(request, timeout=policy.timeout_s) as response:
                length = response.headers.get("Content-Length")
                if length is not None and length.isdigit() and int(length) > policy.max_bytes:
                    _too_big(part, f"{int(length):,} bytes", policy)
                data = _capped(response.read1, part, policy)  # read1: what has arrived
        except MediaError:
            raise
        except urllib.error.HTTPError as exc:
            raise MediaError(f"{part}: fetching {_short(url)} failed with HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
            # A socket times out only at the deadline (it is given the time left), maybe just before the timer fires.
            if fetch.expired or isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError):
                raise late from None
            raise MediaError(f"{part}: fetching {_short(url)} failed ({reason})") from None
        if fetch.expired:  # shut down mid-body: what arrived is cut short
            raise late
        return data


def _capped(read, part: str, policy: MediaPolicy) -> bytes:
    """Read to the end, refusing more than max_bytes."""
    chunks, total = [], 0
    while chunk := read(_CHUNK):
        total += len(chunk)
        if total > policy.max_bytes:
            _too_big(part, f"more than {policy.max_bytes:,} bytes", policy)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_big(part: str, amount: str, policy: MediaPolicy) -> None:
    raise MediaError(f"{part}: {amount} is above the limit of {policy.max_bytes:,} bytes per media item "
                     f"({MAX_BYTES_FLAG}); send a smaller file or raise {MAX_BYTES_FLAG}")


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
