"""What the task oracles read: a phone's settings, alarms, foreground app and what is on screen.

A simulated phone knows everything, including how often each switch was
toggled; a real one reports its global settings and its screen, and what it
cannot report is ``None`` (an oracle that needs it cannot judge that phone).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from edge_infer.agent.ui_tree import parse_ui_dump

# Switch name -> the global setting a real phone keeps it in.
ADB_SETTINGS = {"wifi": "wifi_on", "airplane": "airplane_mode_on"}


@dataclass(frozen=True)
class PhoneState:
    switches: dict[str, bool]
    app: str  # the foreground app's package
    texts: frozenset[str]  # labels on the screen
    alarms: tuple[tuple[str, bool], ...] | None = None  # (time, on); None: unknown
    toggles: dict[str, int] | None = field(default=None)  # times each switch was toggled; None: unknown

    def switch(self, name: str) -> bool | None:
        return self.switches.get(name)

    def has_text(self, text: str) -> bool:
        return any(text in t for t in self.texts)

    def times_toggled(self, name: str) -> int | None:
        return None if self.toggles is None else self.toggles.get(name, 0)


def read_state(device) -> PhoneState:
    """The state of a simulated phone (exact) or of a real one through adb (settings and screen)."""
    own = getattr(device, "phone_state", None)
    if own is not None:
        return own()
    screen = parse_ui_dump(device.dump(), max_elements=10_000)
    switches = {name: device.global_setting(key) == "1" for name, key in ADB_SETTINGS.items()}
    return PhoneState(switches=switches, app=screen.package, texts=frozenset(e.label for e in screen.elements if e.label))
