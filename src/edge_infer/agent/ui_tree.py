"""A ``uiautomator dump`` as the few elements a model can act on.

Android's dump is a tree of ``<node>`` elements, most of them layout
containers. The model sees a flat, numbered list instead: every node it can
act on (clickable, checkable, an editable field) and every text
that is not already part of one. A clickable row with no text of its own
takes the texts of its children as its label, and a switch inside it lends
it its checked state, so a Settings row reads ``[3] Switch "Wi-Fi" off``
the way a person sees it. Tapping the element taps its centre, which lands
on the row on a real phone too.

Dumps come from a device, so they are treated as hostile input: a size cap,
no DTD (uiautomator never writes one; entity tricks need one), and any
parse failure raises ``UiDumpError`` with what was wrong.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from edge_infer.errors import EdgeInferError

MAX_DUMP_BYTES = 4 * 2**20  # real dumps are tens of KB; a screen of a long list a few hundred
MAX_DEPTH = 200  # real hierarchies are a few dozen levels deep; the walk below recurses
MAX_LABEL_CHARS = 60
_BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")


class UiDumpError(EdgeInferError, ValueError):
    """A screen dump that is not a readable uiautomator hierarchy."""


@dataclass(frozen=True)
class Element:
    index: int
    cls: str  # the short class name: "Switch", not "android.widget.Switch"
    text: str
    desc: str  # content-desc
    resource_id: str
    bounds: tuple[int, int, int, int]  # left, top, right, bottom
    clickable: bool
    checkable: bool
    checked: bool
    enabled: bool
    editable: bool

    @property
    def label(self) -> str:
        return self.text or self.desc

    @property
    def center(self) -> tuple[int, int]:
        left, top, right, bottom = self.bounds
        return (left + right) // 2, (top + bottom) // 2

    @property
    def short_id(self) -> str:
        return self.resource_id.rpartition("/")[2]

    def render(self) -> str:
        parts = [f"[{self.index}] {self.cls}"]
        if self.label or self.editable:
            parts.append('"' + _clip(self.label) + '"')
        if self.checkable:
            parts.append("on" if self.checked else "off")
        if not self.enabled:
            parts.append("disabled")
        if self.short_id and (self.editable or not self.label):
            parts.append("#" + self.short_id)
        return " ".join(parts)


@dataclass(frozen=True)
class Screen:
    """The elements of one dump, and how many more there were beyond ``max_elements``."""

    elements: list[Element]
    omitted: int
    package: str  # the foreground app's package, from the root node

    def render(self) -> str:
        lines = [e.render() for e in self.elements] or ["(no elements on this screen)"]
        if self.omitted:
            lines.append(f"({self.omitted} more elements not shown)")
        return "\n".join(lines)

    def signature(self) -> str:
        """What the screen says, without coordinates: equal signatures mean nothing visible changed."""
        return "\n".join(
            f"{e.cls}|{e.label}|{'on' if e.checked else 'off' if e.checkable else ''}|{'' if e.enabled else 'disabled'}"
            for e in self.elements
        ) + f"\n+{self.omitted}"


def parse_ui_dump(xml: str | bytes, max_elements: int = 60) -> Screen:
    """The actionable and textual elements of a dump, in document order, at most ``max_elements``."""
    root = _parse(xml)
    hierarchy = root if root.tag == "hierarchy" else None
    if hierarchy is None or not len(hierarchy):
        raise UiDumpError(f"the dump's root is <{root.tag}> with no <node> inside; expected <hierarchy><node ...>")
    _check_depth(hierarchy)
    found: list[dict] = []
    for top in hierarchy:
        _collect(top, found, inside_actionable=False)
    elements = [Element(index=i, **attrs) for i, attrs in enumerate(found[:max_elements])]
    return Screen(elements, max(0, len(found) - max_elements), hierarchy[0].get("package", ""))


def render_tree(xml: str | bytes, max_elements: int = 60) -> str:
    return parse_ui_dump(xml, max_elements).render()


def screen_signature(xml: str | bytes, max_elements: int = 60) -> str:
    return parse_ui_dump(xml, max_elements).signature()


def _parse(xml: str | bytes) -> ET.Element:
    raw = xml.encode("utf-8", "replace") if isinstance(xml, str) else xml
    if len(raw) > MAX_DUMP_BYTES:
        raise UiDumpError(
            f"the dump is {len(raw):,} bytes, over the {MAX_DUMP_BYTES:,}-byte limit; "
            "a real screen is far smaller, so the device sent something else"
        )
    if not raw.strip():
        raise UiDumpError("the dump is empty; the device returned no hierarchy (is the screen on and unlocked?)")
    if b"<!DOCTYPE" in raw or b"<!ENTITY" in raw:
        raise UiDumpError("the dump declares a DTD or entities, which uiautomator never writes; refusing to parse it")
    start = raw.find(b"<")  # `exec-out uiautomator dump /dev/tty` may print a line around the XML
    end = raw.rfind(b">")
    if start == -1 or end < start:
        raise UiDumpError(f"the dump contains no XML: {raw[:80]!r}")
    try:
        return ET.fromstring(raw[start:end + 1])
    except ET.ParseError as exc:
        raise UiDumpError(f"the dump is not well-formed XML ({exc}); the device's output was cut or garbled") from None


def _check_depth(root: ET.Element) -> None:
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise UiDumpError(f"the dump nests nodes more than {MAX_DEPTH} levels deep; no real screen does")
        stack.extend((child, depth + 1) for child in node)


def _collect(node: ET.Element, out: list[dict], inside_actionable: bool) -> None:
    if node.tag != "node":
        return
    bounds = _bounds(node.get("bounds", ""))
    visible = bounds[2] > bounds[0] and bounds[3] > bounds[1]
    # A switch drawn inside a clickable row (not clickable itself) is part of the row's element.
    absorbed = inside_actionable and node.get("checkable") == "true" and node.get("clickable") != "true"
    actionable = visible and _actionable(node) and not absorbed
    text, desc = node.get("text", "").strip(), node.get("content-desc", "").strip()
    if actionable:
        inner = list(_inner(node))
        check = node if node.get("checkable") == "true" else next((c for c in inner if c.get("checkable") == "true"), None)
        editable = _editable(node)
        if not (text or desc or editable):  # a row: its texts are its label
            text = " · ".join(t for c in inner if (t := c.get("text", "").strip()))
            text = text or next((d for c in inner if (d := c.get("content-desc", "").strip())), "")
        out.append(_attrs(node, check if check is not None else node, text, desc, bounds, editable=editable))
        out[-1].update(
            clickable=any(node.get(flag) == "true" for flag in ("clickable", "long-clickable")),
            checkable=check is not None, checked=check is not None and check.get("checked") == "true",
        )
    elif visible and (text or desc) and not inside_actionable:
        out.append(_attrs(node, node, text, desc, bounds, editable=False))
    for child in node:
        # A row's texts are its label; a clickable child of the row (a button in it) stays its own element.
        _collect(child, out, inside_actionable or actionable)


def _actionable(node: ET.Element) -> bool:
    return _editable(node) or any(node.get(flag) == "true" for flag in ("clickable", "long-clickable", "checkable"))


def _editable(node: ET.Element) -> bool:
    return node.get("class", "").endswith("EditText")


def _inner(node: ET.Element):
    """The descendants that belong to ``node``: not inside (nor being) an actionable descendant."""
    for child in node:
        if child.tag == "node" and not _actionable(child):
            yield child
            yield from _inner(child)
        elif child.tag == "node" and child.get("checkable") == "true" and child.get("clickable") != "true":
            yield child  # a switch widget drawn inside a clickable row


def _attrs(node: ET.Element, kind: ET.Element, text: str, desc: str, bounds: tuple[int, int, int, int], editable: bool) -> dict:
    return dict(
        cls=kind.get("class", "").rpartition(".")[2] or "View", text=text, desc=desc,
        resource_id=node.get("resource-id", ""), bounds=bounds, clickable=False, checkable=False, checked=False,
        enabled=node.get("enabled", "true") == "true", editable=editable,
    )


def _bounds(text: str) -> tuple[int, int, int, int]:
    m = _BOUNDS.fullmatch(text.strip())
    return tuple(int(v) for v in m.groups()) if m else (0, 0, 0, 0)  # type: ignore[return-value]


def _clip(text: str) -> str:
    text = " ".join(text.split()).replace('"', "'")
    return text if len(text) <= MAX_LABEL_CHARS else text[:MAX_LABEL_CHARS - 1] + "…"
