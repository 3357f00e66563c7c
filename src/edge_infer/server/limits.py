"""The request-body limits the server enforces by default (server/http.py's BodyLimit); light, for the CLI's help."""
DEFAULT_MAX_BODY_BYTES = 16 << 20
# JSON items per body (http.json_items), counted before parsing. Above any request the protocol's item counts admit
# (2,048 messages, 8,192 content parts and tool calls, 128 tools with their schemas) plus a prompt's commas (each at
# least a token, so no more than a context holds); parsed, about 13 MB.
DEFAULT_MAX_BODY_ITEMS = 1 << 17
