"""A simulated Android screen: views laid out on a 1080x2400 display, dumped as uiautomator XML.

``SimulatedDevice`` is a ``Device`` like ``AdbDevice``: the agent reads the
same XML format and acts by coordinates. A tap is hit-tested against the
screen as it is at that moment; the deepest clickable view under the point
handles it. What the views do is up to the app behind them (``App``); the
demo phone is in ``phone.py``.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

from edge_infer.agent.state import PhoneState

WIDTH, HEIGHT = 1080, 2400
TOP = 120  # below the status bar
ROW_HEIGHT = 168


@dataclass
class View:
    """One view of a simulated screen; ``on_tap`` makes it clickable."""

    cls: str  # the Android class name, e.g. "android.widget.Switch"
    text: str = ""
    desc: str = ""
    rid: str = ""
    on_tap: Callable[[], None] | None = None
    checkable: bool = False
    checked: bool = False
    enabled: bool = True
    focused: bool = False
    height: int = ROW_HEIGHT  # in a column; rows and grids split their width
    arrange: str = "column"  # how the children are placed: "column", "row" or "grid"
    columns: int = 4  # for "grid"
    children: list["View"] = field(default_factory=list)
    bounds: tuple[int, int, int, int] = (0, 0, 0, 0)


class App(Protocol):
    """What a simulated phone does; the device turns its screens into XML and its input into calls."""

    package: str

    def screen(self) -> View: ...
    def key(self, key: str) -> None: ...
    def launch(self, name: str) -> None: ...
    def type(self, text: str) -> None: ...
    def state(self) -> PhoneState: ...


def layout(view: View, bounds: tuple[int, int, int, int]) -> None:
    view.bounds = bounds
    left, top, right, bottom = bounds
    kids = view.children
    if view.arrange == "row":
        width = (right - left) // max(1, len(kids))
        for i, child in enumerate(kids):
            layout(child, (left + i * width, top, left + (i + 1) * width, bottom))
    elif view.arrange == "grid":
        width = (right - left) // view.columns
        for i, child in enumerate(kids):
            row, col = divmod(i, view.columns)
            y = top + row * child.height
            layout(child, (left + col * width, y, left + (col + 1) * width, y + child.height))
    else:
        y = top
        for child in kids:
            layout(child, (left, y, right, min(bottom, y + child.height)))
            y += child.height


def walk(view: View) -> Iterator[View]:
    yield view
    for child in view.children:
        yield from walk(child)


def to_xml(root: View, package: str) -> str:
    hierarchy = ET.Element("hierarchy", rotation="0")
    _node(hierarchy, root, 0, package)
    return "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>" + ET.tostring(hierarchy, encoding="unicode")


def _node(parent: ET.Element, view: View, index: int, package: str) -> None:
    flag = lambda value: "true" if value else "false"  # noqa: E731
    left, top, right, bottom = view.bounds
    node = ET.SubElement(parent, "node", {
        "index": str(index), "text": view.text, "resource-id": f"{package}:id/{view.rid}" if view.rid else "",
        "class": view.cls, "package": package, "content-desc": view.desc,
        "checkable": flag(view.checkable), "checked": flag(view.checked), "clickable": flag(view.on_tap),
        "enabled": flag(view.enabled), "focusable": flag(view.on_tap), "focused": flag(view.focused),
        "scrollable": "false", "long-clickable": "false", "password": "false", "selected": "false",
        "bounds": f"[{left},{top}][{right},{bottom}]",
    })
    for i, child in enumerate(view.children):
        _node(node, child, i, package)


def _name(view: View) -> str:
    """What a person would call the view: its text, or its first child's (a row), or its id."""
    return next((t for v in walk(view) for t in (v.text, v.desc) if t), view.rid or view.cls)


class SimulatedDevice:
    """A ``Device`` over a simulated ``App``; ``records`` lists every input it received."""

    def __init__(self, app: App):
        self.app = app
        self.records: list[tuple] = []

    def _laid_out(self) -> View:
        screen = self.app.screen()
        screen.height = HEIGHT - TOP
        status_bar = View("android.view.View", rid="status_bar", height=TOP)
        root = View("android.widget.FrameLayout", children=[status_bar, screen])
        layout(root, (0, 0, WIDTH, HEIGHT))
        return root

    def dump(self) -> str:
        return to_xml(self._laid_out(), self.app.package)

    def tap(self, x: int, y: int) -> None:
        hit = None
        for view in walk(self._laid_out()):
            left, top, right, bottom = view.bounds
            if view.on_tap and left <= x < right and top <= y < bottom:
                hit = view  # the deepest clickable view under the point comes last
        self.records.append(("tap", x, y, _name(hit) if hit else None))
        if hit is not None and hit.enabled:
            hit.on_tap()

    def input_text(self, text: str) -> None:
        self.records.append(("text", text))
        self.app.type(text)

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None:
        # The demo phone's screens all fit the display: nothing scrolls.
        self.records.append(("swipe", x1, y1, x2, y2))

    def keyevent(self, key: str) -> None:
        self.records.append(("key", key))
        self.app.key(key)

    def launch(self, app: str) -> None:
        self.records.append(("launch", app))
        self.app.launch(app)

    def size(self) -> tuple[int, int]:
        return WIDTH, HEIGHT

    def phone_state(self) -> PhoneState:
        """The exact state, for the oracles (a real phone's comes from ``state.read_state``)."""
        return self.app.state()
