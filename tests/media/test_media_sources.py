"""Media sources: data: URLs, file:// under the allowed directory only, http(s) only when allowed; size caps."""
from __future__ import annotations

import base64
import http.server
import os
import threading
import time
from pathlib import Path

import pytest

from edge_infer.errors import MediaError
from edge_infer.media.sources import MediaPolicy, decode_base64, read_source

PAYLOAD = bytes(range(256)) * 40  # 10240 bytes


def _data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def test_data_urls_give_their_bytes():
    assert read_source(_data_url(PAYLOAD), MediaPolicy()) == PAYLOAD
    wrapped = base64.encodebytes(PAYLOAD).decode()  # 76-character lines, as some clients send
    assert read_source(f"data:audio/wav;base64,{wrapped}", MediaPolicy()) == PAYLOAD
    assert decode_base64(base64.b64encode(PAYLOAD).decode(), MediaPolicy()) == PAYLOAD
    # what browsers' atob and JavaScript encoders also send: no padding, the URL-safe alphabet
    for odd in (PAYLOAD[:1000], PAYLOAD[:1001], PAYLOAD[:1002]):
        assert decode_base64(base64.b64encode(odd).decode().rstrip("="), MediaPolicy()) == odd
        assert decode_base64(base64.urlsafe_b64encode(odd).decode().rstrip("="), MediaPolicy()) == odd


@pytest.mark.parametrize("url,message", [
    ("data:image/png;base64,iVBORw0K!!!", r"^image 1: the data is not valid base64 \(.+\); encode the file with "
                                          r"standard base64$"),
    ("data:image/png;base64,abcde", r"^image 1: the data is not valid base64"),  # no padding makes 5 characters whole
    ("data:image/png;base64,ab+c-d", r"^image 1: the data is not valid base64"),  # two alphabets at once
    ("data:text/plain,hello", r"^image 1: the data: URL is not base64 \(data:text/plain\); use "
                              r"data:<type>;base64,<data>$"),
    ("data:image/png;base64", r"^image 1: the data: URL has no ',' before its data"),
    ("ftp://example.com/a.png", r"^image 1: the URL ftp://example.com/a.png has no scheme edge-infer reads; send a "
                                r"data: URL \(base64\), a file:// path or an http\(s\):// URL$"),
    ("just-some-text", r"^image 1: the URL just-some-text has no scheme edge-infer reads"),
])
def test_bad_data_and_schemes_are_refused(url, message):
    with pytest.raises(MediaError, match=message):
        read_source(url, MediaPolicy(), part="image 1")


def test_every_source_is_capped():
    policy = MediaPolicy(max_bytes=1000)
    with pytest.raises(MediaError) as err:
        read_source(_data_url(PAYLOAD), policy, part="audio 1")
    assert str(err.value) == ("audio 1: 10,240 bytes is above the limit of 1,000 bytes per media item "
                              "(--max-media-bytes); send a smaller file or raise --max-media-bytes")
    assert read_source(_data_url(PAYLOAD[:1000]), policy) == PAYLOAD[:1000]


@pytest.fixture
def media_dir(tmp_path: Path) -> Path:
    allowed = tmp_path / "allowed"
    (allowed / "sub").mkdir(parents=True)
    (allowed / "sub" / "cat.png").write_bytes(PAYLOAD)
    (tmp_path / "secret.txt").write_bytes(b"not yours")
    return allowed


def test_files_under_the_allowed_directory_are_read(media_dir):
    policy = MediaPolicy(allowed_dir=media_dir)
    assert read_source(f"file://{media_dir}/sub/cat.png", policy) == PAYLOAD
    assert read_source(f"file://localhost{media_dir}/sub/cat.png", policy) == PAYLOAD
    assert read_source(f"file://{media_dir}/sub/../sub/cat.png", policy) == PAYLOAD
    (media_dir / "my cat.png").write_bytes(b"x")
    assert read_source(f"file://{media_dir}/my%20cat.png", policy) == b"x"
    link = media_dir / "inside-link.png"
    link.symlink_to(media_dir / "sub" / "cat.png")  # a link that stays inside is fine
    assert read_source(f"file://{link}", policy) == PAYLOAD


def test_file_urls_are_off_without_an_allowed_directory(media_dir):
    with pytest.raises(MediaError) as err:
        read_source(f"file://{media_dir}/sub/cat.png", MediaPolicy(), part="image 1")
    assert str(err.value) == ("image 1: file:// URLs are off; the server reads local files only under a directory "
                              "the operator allows (--allowed-media-dir DIR)")


def test_files_outside_the_allowed_directory_are_refused(media_dir):
    policy = MediaPolicy(allowed_dir=media_dir)
    outside = media_dir.parent / "secret.txt"
    escape = media_dir / "escape.png"
    escape.symlink_to(outside)
    (media_dir / "dirlink").symlink_to(media_dir.parent)
    for url in (f"file://{outside}",  # plainly outside
                f"file://{media_dir}/../secret.txt",  # .. out of it
                f"file://{media_dir}/sub/%2E%2E/%2E%2E/secret.txt",  # .. percent-encoded
                f"file://{escape}",  # a symlink inside pointing out
                f"file://{media_dir}/dirlink/secret.txt",  # through a linked directory
                f"file://{media_dir.parent}/no-such-file.png"):  # missing: the same answer as for what exists
        with pytest.raises(MediaError) as err:
            read_source(url, policy, part="image 1")
        assert str(err.value).startswith("image 1: file://")
        assert str(err.value).endswith(f"is outside the allowed media directory {media_dir.resolve()} "
                                       "(--allowed-media-dir); put the file there"), url


def test_a_path_swapped_for_a_link_after_the_check_is_refused(media_dir, monkeypatch):
    """Between the check and the open, a directory on the path can be replaced by a link out of the allowed
    directory (O_NOFOLLOW guards the last component only): what the kernel opened is checked again."""
    import edge_infer.media.sources as sources

    outside = media_dir.parent / "secret.txt"
    real_open = os.open
    monkeypatch.setattr(sources.os, "open", lambda path, flags: real_open(outside, flags))
    with pytest.raises(MediaError, match=r"is outside the allowed media directory"):
        read_source(f"file://{media_dir}/sub/cat.png", MediaPolicy(allowed_dir=media_dir), part="image 1")


def test_allowed_directory_given_through_a_symlink(tmp_path, media_dir):
    alias = tmp_path / "alias"
    alias.symlink_to(media_dir)
    assert read_source(f"file://{media_dir}/sub/cat.png", MediaPolicy(allowed_dir=alias)) == PAYLOAD


@pytest.mark.parametrize("tail,message", [
    ("/sub/missing.png", r"does not exist$"),
    ("/sub", r"is not a regular file$"),
])
def test_missing_and_odd_files_are_refused(media_dir, tail, message):
    with pytest.raises(MediaError, match=message):
        read_source(f"file://{media_dir}{tail}", MediaPolicy(allowed_dir=media_dir))


def test_fifos_and_hosts_and_relative_paths_are_refused(media_dir):
    policy = MediaPolicy(allowed_dir=media_dir)
    os.mkfifo(media_dir / "pipe")  # reading it would block forever
    with pytest.raises(MediaError, match=r"is not a regular file$"):
        read_source(f"file://{media_dir}/pipe", policy)
    with pytest.raises(MediaError, match=r"file:// URL names host 'evil.example'; only local paths"):
        read_source(f"file://evil.example{media_dir}/sub/cat.png", policy)
    with pytest.raises(MediaError, match=r"is not an absolute path; use file:///absolute/path$"):
        read_source("file:sub/cat.png", policy)


def test_large_files_are_refused(media_dir):
    with pytest.raises(MediaError, match=r"^image 1: 10,240 bytes is above the limit of 100 bytes per media item "
                                         r"\(--max-media-bytes\)"):
        read_source(f"file://{media_dir}/sub/cat.png", MediaPolicy(allowed_dir=media_dir, max_bytes=100),
                    part="image 1")


def test_remote_urls_are_off_without_the_flag():
    with pytest.raises(MediaError) as err:
        read_source("https://example.com/cat.png", MediaPolicy(), part="image 1")
    assert str(err.value) == ("image 1: remote media URLs are off; send the file as a data: URL, or start the "
                              "server with --allow-remote-media to let it fetch http(s) URLs")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the stdlib's name)
        if self.path == "/cat.png":
            self._send(200, PAYLOAD)
        elif self.path == "/streamed":  # no Content-Length: the cap is found while reading
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(20):
                    self.wfile.write(PAYLOAD)
            except OSError:  # the client stops reading at its cap
                pass
        elif self.path == "/slow":  # trickles forever, a byte at a time
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass
        elif self.path == "/slow-headers":  # a status line, then a header now and then: never a body
            self.send_response(200)
            try:
                for i in range(100):
                    self.send_header(f"X-Wait-{i}", "1")
                    self.flush_headers()
                    time.sleep(0.05)
            except OSError:
                pass
        elif self.path == "/many-headers":  # more than http.client takes
            self.send_response(200)
            for i in range(150):
                self.send_header(f"X-{i}", "1")
            self.end_headers()
        elif self.path == "/bad-status":
            self.wfile.write(b"garbage\r\n\r\n")
        elif self.path in ("/to-file", "/to-ftp"):
            self.send_response(302)
            self.send_header("Location", "file:///etc/passwd" if self.path == "/to-file" else "ftp://127.0.0.1/x")
            self.end_headers()
        elif self.path == "/to-cat":
            self.send_response(302)
            self.send_header("Location", "/cat.png")
            self.end_headers()
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_remote_urls_are_fetched_when_allowed(server):
    policy = MediaPolicy(allow_remote=True)
    assert read_source(f"{server}/cat.png", policy) == PAYLOAD
    assert read_source(f"{server}/to-cat", policy) == PAYLOAD


def test_remote_fetches_are_capped(server):
    policy = MediaPolicy(allow_remote=True, max_bytes=5000)
    with pytest.raises(MediaError, match=r"^image 1: 10,240 bytes is above the limit of 5,000 bytes per media item "
                                         r"\(--max-media-bytes\)"):
        read_source(f"{server}/cat.png", policy, part="image 1")
    with pytest.raises(MediaError, match=r"^image 1: more than 5,000 bytes is above the limit of 5,000 bytes"):
        read_source(f"{server}/streamed", policy, part="image 1")


def test_a_slow_remote_source_hits_the_deadline(server):
    policy = MediaPolicy(allow_remote=True, timeout_s=0.4)
    started = time.monotonic()
    with pytest.raises(MediaError, match=r"^image 1: the download took longer than 0.4 s; send a smaller file or a "
                                         r"data: URL$"):
        read_source(f"{server}/slow", policy, part="image 1")
    assert time.monotonic() - started < 10  # it trickles for ever; loose for a loaded machine


def test_a_server_that_trickles_its_headers_hits_the_deadline(server):
    """A socket timeout bounds each read only: the whole fetch, headers included, is bounded by the deadline
    (two such fetches once held both of the server's media threads for as long as the remote side wished)."""
    policy = MediaPolicy(allow_remote=True, timeout_s=0.4)
    started = time.monotonic()
    with pytest.raises(MediaError, match=r"^image 1: the download took longer than 0.4 s"):
        read_source(f"{server}/slow-headers", policy, part="image 1")
    assert time.monotonic() - started < 10  # it trickles for ever; loose for a loaded machine


def test_each_connection_gets_the_time_left(server, monkeypatch):
    """socket.create_connection gives each of a host's addresses its own timeout: a name with several unreachable
    addresses held a fetch for that many times timeout_s. Every connection is given what is left of the deadline."""
    import socket

    import edge_infer.media.sources as sources

    given = []
    real = socket.create_connection
    monkeypatch.setattr(sources.socket, "create_connection",
                        lambda address, timeout, *rest: given.append(timeout) or real(address, timeout, *rest))
    assert read_source(f"{server}/to-cat", MediaPolicy(allow_remote=True, timeout_s=20.0)) == PAYLOAD  # a redirect
    assert len(given) == 2 and 20.0 > given[0] > given[1] > 10.0


@pytest.mark.parametrize("path,reason", [("/many-headers", r"HTTPException: got more than 100 headers"),
                                         ("/bad-status", r"BadStatusLine: garbage")])
def test_a_malformed_response_is_a_media_error(server, path, reason):
    with pytest.raises(MediaError, match=rf"^image 1: fetching http://127\.0\.0\.1:\d+{path} failed \({reason}"):
        read_source(f"{server}{path}", MediaPolicy(allow_remote=True, timeout_s=2.0), part="image 1")


def test_remote_failures_are_refused(server):
    policy = MediaPolicy(allow_remote=True, timeout_s=2.0)
    with pytest.raises(MediaError, match=r"^image 1: fetching http://127\.0\.0\.1:\d+/nope failed with HTTP 404"):
        read_source(f"{server}/nope", policy, part="image 1")
    with pytest.raises(MediaError, match=r"^image 1: fetching .*/to-ftp failed \(it redirects to ftp://127.0.0.1/x, "
                                         r"and only http\(s\) redirects are followed\)$"):
        read_source(f"{server}/to-ftp", policy, part="image 1")  # urllib alone would follow this one
    with pytest.raises(MediaError, match=r"^image 1: fetching .*/to-file failed"):
        read_source(f"{server}/to-file", policy, part="image 1")
    with pytest.raises(MediaError, match=r"^image 1: fetching http://127\.0\.0\.1:9/x failed \(.+\)$"):
        read_source("http://127.0.0.1:9/x", policy, part="image 1")  # nothing listens on the discard port


@pytest.mark.parametrize("timer_late", [False, True])
def test_a_tls_handshake_that_trickles_hits_the_deadline(monkeypatch, timer_late):
    """A server that announces a 16 KiB handshake record and then sends it a byte at a time (14 minutes) is cut
    at the deadline too: CPython bounds a handshake as a whole by the socket timeout, which is the time left.
    Whichever comes first, that timeout or the fetch's timer (late here on purpose, as on a loaded machine), the
    answer is the deadline's."""
    import socket

    import edge_infer.media.sources as sources

    if timer_late:
        expire = sources._Fetch._expire
        monkeypatch.setattr(sources._Fetch, "_expire", lambda fetch: time.sleep(0.5) or expire(fetch))

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"\x16\x03\x03\x40\x00")  # a TLS handshake record of 16,384 bytes follows...
            while not stop.wait(0.05):
                try:
                    conn.sendall(b"\x00")  # ...slowly
                except OSError:
                    return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        with pytest.raises(MediaError, match=r"^image 1: the download took longer than 0.4 s"):
            read_source(f"https://127.0.0.1:{listener.getsockname()[1]}/cat.png",
                        MediaPolicy(allow_remote=True, timeout_s=0.4), part="image 1")
        assert time.monotonic() - started < 10  # the trickle lasts until the test ends
    finally:
        stop.set()
        listener.close()
        thread.join(5)
