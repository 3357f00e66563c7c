"""The request limits the server enforces by default (server/http.py's BodyLimit, server/connection.py); light, for the
CLI's help."""
DEFAULT_MAX_BODY_BYTES = 16 << 20
# JSON items per body (its commas and brackets, http.BodyCost.of), counted before it is parsed: bounds what parsing
# one body takes (at most ~20 MB measured, benchmarks/results/hostile-shapes.json). A chat or prompt that fits a
# 64k-token context has fewer: a message is 3 items and 6 tokens or more, a text part 3 and 2, a comma 1 and 1.
DEFAULT_MAX_BODY_ITEMS = 1 << 17
# Seconds a connection gets to send a complete request head (after it opens, or after its last response ends), a
# request its whole body (after its head), and a client to take what it is sent once the socket is full: a client
# that sends nothing, a byte now and then, or stops reading holds a connection (a file descriptor) only that long.
# 16 MiB in 60 s is 2.2 Mbit/s.
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_SEND_TIMEOUT_S = 60.0
