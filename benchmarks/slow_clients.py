"""What slow clients hold of `edge-infer serve` (docs/serving.md, "Slow clients").

    python benchmarks/slow_clients.py --out benchmarks/results/slow-clients.json [--before-src DIR]

Four clients that send or read nothing, each against a fresh demo server with its default flags, while a real
client's request is timed:
- 128 connections that send nothing, with the server's descriptors limited to those it had open plus 64: when is
  the real client's chat answered (the rest wait in the listen queue);
- 64 connections that send half a request head: how many the server still holds 15 s and 30 s later;
- a request whose body stops after 20 of its announced 1,000,000 bytes: when it is answered, and with what;
- a streamed chat (4 sequences, 1,900 tokens each, logprobs) to a socket that reads nothing: when its sequences are
  freed (`edge_infer_sequences_in_flight` back to 0).
Anything not done within ``--timeout-s`` is reported as such. ``--before-src`` runs the same against another source
tree in the same run.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sys
import time
from contextlib import ExitStack

import httpx

from serve_hostile import REPO, Server, before_after_parser, provenance_stamp, write_result

CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
STALLED_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def timed_chat(server: Server, timeout_s: float) -> float | None:
    start = time.monotonic()
    try:
        r = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=timeout_s)
        assert r.status_code == 200, r.text
    except httpx.TimeoutException:
        return None
    return round(time.monotonic() - start, 2)


def still_open(sockets: list[socket.socket]) -> int:
    """How many of ``sockets`` the server has not closed (whatever it sent first is read and dropped)."""
    held = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            while sock.recv(65536):
                pass
        except BlockingIOError:  # nothing more yet, and no end
            held += 1
        except OSError:  # reset
            pass
    return held


def in_flight(server: Server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith("edge_infer_sequences_in_flight "))


def idle_past_the_descriptor_limit(server: Server, timeout_s: float) -> dict:
    pid = server.proc.pid
    limit = len(os.listdir(f"/proc/{pid}/fd")) + 64
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]))
    with ExitStack() as idle:
        for _ in range(128):
            idle.enter_context(connect(server))
        return {"descriptor_limit": limit, "idle_connections": 128, "chat_answered_s": timed_chat(server, timeout_s)}


def half_heads(server: Server, timeout_s: float) -> dict:
    with ExitStack() as stack:
        sockets = [stack.enter_context(connect(server)) for _ in range(64)]
        for sock in sockets:
            sock.sendall(STALLED_HEAD)
        chat = timed_chat(server, timeout_s)
        time.sleep(15)
        after_15 = still_open(sockets)
        time.sleep(15)
        return {"connections": 64, "chat_answered_s": chat, "held_after_15_s": after_15, "held_after_30_s": still_open(sockets)}


def stalled_body(server: Server, timeout_s: float) -> dict:
    with connect(server) as sock:
        sock.sendall(STALLED_HEAD + b"Content-Length: 1000000\r\n\r\n" + json.dumps(CHAT).encode()[:20])
        sock.settimeout(timeout_s)
        start = time.monotonic()
        try:
            answer = sock.recv(65536)
        except TimeoutError:
            return {"answered_s": None, "status": None}
        return {"answered_s": round(time.monotonic() - start, 2), "status": int(answer.split()[1])}


def reads_nothing(server: Server, timeout_s: float) -> dict:
    body = json.dumps({**CHAT, "max_tokens": 1900, "n": 4, "ignore_eos": True, "stream": True, "logprobs": True,
                       "top_logprobs": 20}).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            time.sleep(0.5)
            if in_flight(server) == 0:
                return {"sequences": 4, "freed_s": round(time.monotonic() - start, 1)}
        return {"sequences": 4, "freed_s": None}


SCENARIOS = {"128 idle connections past the descriptor limit": idle_past_the_descriptor_limit,
             "64 half request heads": half_heads, "a body that stops": stalled_body,
             "a streamed answer nobody reads": reads_nothing}


def main() -> int:
    parser = before_after_parser(__doc__)
    parser.add_argument("--timeout-s", type=float, default=150.0)
    args = parser.parse_args()
    stamp = provenance_stamp()
    result = {"benchmark": "slow-clients", "model": "the embedded demo model", "flags": "the defaults",
              "timeout_s": args.timeout_s, "arms": {}}
    arms = [("after", REPO / "src")] + ([("before", args.before_src)] if args.before_src is not None else [])
    for label, src in arms:
        result["arms"][label] = {"src": str(src)}
        for name, scenario in SCENARIOS.items():
            print(f"== {label}: {name}", file=sys.stderr)
            server = Server(src, [])
            try:
                timed_chat(server, args.timeout_s)  # warm: first-use imports open files too
                result["arms"][label][name] = scenario(server, args.timeout_s)
            finally:  # the server and its workers, whatever they wait for
                os.killpg(server.proc.pid, signal.SIGKILL)
                server.proc.wait()
            print(json.dumps(result["arms"][label][name]), file=sys.stderr)
    write_result(args.out, result, stamp)
    print(json.dumps(result["arms"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
