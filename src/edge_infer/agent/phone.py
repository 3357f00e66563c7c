"""The demo phone: a launcher, Settings and Clock, enough for the task suite.

- Home: a grid of app icons; tapping one (or ``launch``) opens the app at its first screen.
- Settings: a list of sections. *Network & internet* holds the Wi-Fi,
  Airplane mode and Data Saver switches (and, on some variants, decoy
  switches whose labels also say Wi-Fi); *Connected devices*, *Display* and
  *Battery* hold one switch each; the other sections are empty pages.
- Clock: tabs Alarms / Clock / Timer / Stopwatch. Alarms lists the alarms
  (each a switch) and an *Add alarm* button that opens a time picker: hour
  and minute fields, AM / PM, Cancel and Save.
- Keys: back leaves the current screen (never the launcher), home returns to it.

Variants change what the agent sees, not what the phone does: ``labels``
renames things (internal key -> label), ``shuffle`` reorders every list with
that seed, ``decoys`` adds the decoy switches. Every toggle is recorded in
``toggled``, every typed field in ``fields``.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from edge_infer.agent.device import APP_PACKAGES, DeviceError
from edge_infer.agent.simulator import ROW_HEIGHT, SimulatedDevice, View, walk
from edge_infer.agent.state import PhoneState

LAUNCHER = "com.google.android.apps.nexuslauncher"
HOME_APPS = ("phone", "messages", "camera", "photos", "chrome", "clock", "calendar", "settings")
PACKAGES = {app: APP_PACKAGES[app] for app in HOME_APPS}  # as on a Pixel, so oracles read both alike

# Everything the agent reads, by key; a variant's ``labels`` overrides these.
LABELS = {
    "phone": "Phone", "messages": "Messages", "camera": "Camera", "photos": "Photos", "chrome": "Chrome",
    "clock": "Clock", "calendar": "Calendar", "settings": "Settings",
    "network": "Network & internet", "connected": "Connected devices", "apps": "Apps",
    "notifications": "Notifications", "battery": "Battery", "display": "Display", "sound": "Sound & vibration",
    "about": "About phone", "mobile": "Mobile network", "tethering": "Hotspot & tethering", "vpn": "VPN",
    "wifi": "Wi-Fi", "airplane": "Airplane mode", "data_saver": "Data Saver", "bluetooth": "Bluetooth",
    "dark_theme": "Dark theme", "battery_saver": "Battery Saver",
    "wifi_calling": "Wi-Fi calling", "wifi_hotspot": "Wi-Fi hotspot",
    "alarms": "Alarms", "world_clock": "Clock", "timer": "Timer", "stopwatch": "Stopwatch",
}
SWITCHES = ("wifi", "airplane", "data_saver", "bluetooth", "dark_theme", "battery_saver", "wifi_calling", "wifi_hotspot")
DECOYS = ("wifi_calling", "wifi_hotspot")
SETTINGS_SECTIONS = ("network", "connected", "apps", "notifications", "battery", "display", "sound", "about")
NETWORK_ITEMS = ("wifi", "mobile", "airplane", "tethering", "data_saver", "vpn")
SECTION_SWITCHES = {"connected": ("bluetooth",), "display": ("dark_theme",), "battery": ("battery_saver",)}
SUMMARIES = {"network": ("wifi", "mobile"), "connected": ("bluetooth",), "display": ("dark_theme",)}
CLOCK_TABS = ("alarms", "world_clock", "timer", "stopwatch")
DEFAULT_ALARMS = (("6:30 AM", True), ("8:00 AM", False))


@dataclass(frozen=True)
class Variant:
    """How the demo phone looks: renamed labels, a shuffle seed, decoy switches shown."""

    labels: tuple[tuple[str, str], ...] = ()
    shuffle: int | None = None
    decoys: tuple[str, ...] = ()


class DemoPhone:
    def __init__(self, switches: dict[str, bool] | None = None, alarms=DEFAULT_ALARMS, variant: Variant = Variant()):
        unknown = set(switches or ()) - set(SWITCHES)
        if unknown:
            raise ValueError(f"unknown switches {sorted(unknown)}; the demo phone has {', '.join(SWITCHES)}")
        self.switches = {name: False for name in SWITCHES} | dict(switches or {})
        self.alarms: list[list] = [[time, on] for time, on in alarms]
        self.variant = variant
        self.labels = LABELS | dict(variant.labels)
        self.stack = ["home"]
        self.fields: dict[str, str] = {}
        self.focus: str | None = None
        self.meridiem = "AM"
        self.notice = ""
        self.toggled: list[tuple[str, bool]] = []

    # -- what the device asks -------------------------------------------------------

    @property
    def package(self) -> str:
        app = self.stack[-1].partition("/")[0]
        return LAUNCHER if app == "home" else PACKAGES[app]

    def screen(self) -> View:
        name = self.stack[-1]
        app, _, page = name.partition("/")
        if app == "home":
            return self._home()
        if app == "settings":
            return self._settings(page)
        if app == "clock":
            return self._clock(page)
        return _page(self.labels[app], [View("android.widget.TextView", text="This app is not part of the simulation.")])

    def key(self, key: str) -> None:
        if key == "back" and len(self.stack) > 1:
            self._leave()
        elif key == "home":
            self.stack = ["home"]
            self._unfocus()
        elif key == "del" and self.focus:
            self.fields[self.focus] = self.fields.get(self.focus, "")[:-1]
        elif key not in ("back", "enter", "move_end", "del"):
            raise DeviceError(f"the simulated phone has no key {key!r}")

    def launch(self, name: str) -> None:
        app = self._app_named(name)
        self.stack = ["home", {"settings": "settings/", "clock": "clock/world_clock"}.get(app, app)]
        self._unfocus()

    def type(self, text: str) -> None:
        if self.focus is None:
            raise DeviceError("no text field is focused, so the text went nowhere")
        self.fields[self.focus] = self.fields.get(self.focus, "") + text

    def state(self) -> PhoneState:
        texts = frozenset(t for view in walk(self.screen()) for t in (view.text, view.desc) if t)
        return PhoneState(
            switches=dict(self.switches), app=self.package, texts=texts,
            alarms=tuple((time, on) for time, on in self.alarms), toggles=dict(Counter(name for name, _ in self.toggled)),
        )

    # -- screens ----------------------------------------------------------------------

    def _order(self, keys: tuple[str, ...], salt: str) -> list[str]:
        keys = list(keys)
        if self.variant.shuffle is not None:
            random.Random(f"{self.variant.shuffle}/{salt}").shuffle(keys)
        return keys

    def _home(self) -> View:
        icons = [View("android.widget.TextView", text=self.labels[app], desc=self.labels[app], height=300,
                      on_tap=lambda app=app: self.launch(app)) for app in self._order(HOME_APPS, "home")]
        grid = View("android.view.ViewGroup", arrange="grid", height=300 * -(-len(icons) // 4), children=icons)
        return View("android.widget.FrameLayout", children=[grid])

    def _settings(self, page: str) -> View:
        if page == "":
            rows = [self._section_row(key) for key in self._order(SETTINGS_SECTIONS, "settings")]
            return View("android.widget.FrameLayout", children=[_title(self.labels["settings"]), *rows])
        if page == "network":
            items = self._order(NETWORK_ITEMS, "network")
            for decoy in self.variant.decoys:  # next to Wi-Fi, where a hasty reader would look
                items.insert(items.index("wifi") + (decoy == "wifi_hotspot"), decoy)
            rows = [self._switch_row(k) if k in SWITCHES else self._link_row(k, f"settings/{k}") for k in items]
            return _page(self.labels["network"], rows, self._leave)
        rows = [self._switch_row(k) for k in SECTION_SWITCHES.get(page, ())]
        return _page(self.labels[page], rows or [View("android.widget.TextView", text="Nothing to change here.")], self._leave)

    def _section_row(self, key: str) -> View:
        summary = ", ".join(self.labels[k] for k in SUMMARIES.get(key, ()))
        return self._link_row(key, f"settings/{key}", summary)

    def _link_row(self, key: str, target: str, summary: str = "") -> View:
        texts = [View("android.widget.TextView", text=self.labels[key], rid="title", height=ROW_HEIGHT // 2)]
        if summary:
            texts.append(View("android.widget.TextView", text=summary, rid="summary", height=ROW_HEIGHT // 2))
        return View("android.widget.LinearLayout", on_tap=lambda: self._open(target), children=texts)

    def _switch_row(self, key: str) -> View:
        title = View("android.widget.TextView", text=self.labels[key], rid="title")
        switch = View("android.widget.Switch", rid="switch_widget", checkable=True, checked=self.switches[key])
        return View("android.widget.LinearLayout", arrange="row", on_tap=lambda: self._toggle(key), children=[title, switch])

    def _clock(self, page: str) -> View:
        if page == "new_alarm":
            return self._time_picker()
        if page == "alarms":
            body = [View("android.widget.Switch", text=time, rid="digital_clock", checkable=True, checked=on,
                         on_tap=lambda i=i: self._toggle_alarm(i)) for i, (time, on) in enumerate(self.alarms)]
            body.append(View("android.widget.ImageButton", desc="Add alarm", rid="fab", on_tap=lambda: self._open("clock/new_alarm")))
        elif page == "world_clock":
            body = [View("android.widget.TextClock", text="10:08", rid="digital_clock", height=300),
                    View("android.widget.TextView", text="Wed, May 6", rid="date")]
        else:
            body = [View("android.widget.TextView", text="00:00:00" if page == "timer" else "00:00.00", height=300)]
        tabs = [View("android.widget.TextView", text=self.labels[tab], rid="tab", on_tap=lambda tab=tab: self._tab(tab))
                for tab in CLOCK_TABS]
        return View("android.widget.FrameLayout", children=[*body, View("android.widget.LinearLayout", arrange="row", children=tabs)])

    def _time_picker(self) -> View:
        def field(rid: str) -> View:
            return View("android.widget.EditText", text=self.fields.get(rid, ""), rid=rid, focused=self.focus == rid,
                        on_tap=lambda: setattr(self, "focus", rid))

        def meridiem(label: str) -> View:
            return View("android.widget.RadioButton", text=label, checkable=True, checked=self.meridiem == label,
                        on_tap=lambda: setattr(self, "meridiem", label))

        views = [
            _title("Set alarm"),
            View("android.widget.LinearLayout", arrange="row", children=[field("hour"), field("minute")]),
            View("android.widget.RadioGroup", arrange="row", children=[meridiem("AM"), meridiem("PM")]),
            View("android.widget.LinearLayout", arrange="row", children=[
                View("android.widget.Button", text="Cancel", on_tap=self._leave),
                View("android.widget.Button", text="Save", on_tap=self._save_alarm),
            ]),
        ]
        if self.notice:
            views.append(View("android.widget.TextView", text=self.notice, rid="error"))
        return View("android.widget.FrameLayout", children=views)

    # -- what taps do ----------------------------------------------------------------------

    def _open(self, target: str) -> None:
        self.stack.append(target)
        if target == "clock/new_alarm":
            self.fields = {"hour": "", "minute": ""}
            self.meridiem, self.notice = "AM", ""

    def _leave(self) -> None:
        if len(self.stack) > 1:
            self.stack.pop()
        self._unfocus()

    def _unfocus(self) -> None:
        self.focus = None

    def _tab(self, tab: str) -> None:
        self.stack[-1] = f"clock/{tab}"

    def _toggle(self, key: str) -> None:
        self.switches[key] = not self.switches[key]
        self.toggled.append((key, self.switches[key]))

    def _toggle_alarm(self, index: int) -> None:
        self.alarms[index][1] = not self.alarms[index][1]

    def _save_alarm(self) -> None:
        hour, minute = self.fields.get("hour", "").strip(), self.fields.get("minute", "").strip()
        if not (hour.isdigit() and 1 <= int(hour) <= 12 and minute.isdigit() and len(minute) <= 2 and int(minute) <= 59):
            self.notice = "Enter an hour from 1 to 12 and minutes from 00 to 59."
            return
        self.alarms.append([f"{int(hour)}:{int(minute):02d} {self.meridiem}", True])
        self._leave()

    def _app_named(self, name: str) -> str:
        wanted = name.strip().lower()
        for app in HOME_APPS:
            if wanted in (app, self.labels[app].lower(), PACKAGES.get(app)):
                return app
        apps = ", ".join(self.labels[app] for app in HOME_APPS)
        raise DeviceError(f"there is no app called {name!r} on this phone; its apps are {apps}")


def _title(text: str) -> View:
    return View("android.widget.TextView", text=text, rid="title", height=200)


def _page(title: str, rows: list[View], up=None) -> View:
    bar = [View("android.widget.ImageButton", desc="Navigate up", on_tap=up)] if up else []
    return View("android.widget.FrameLayout", children=[
        View("android.widget.LinearLayout", arrange="row", height=200, children=[*bar, _title(title)]), *rows,
    ])


def demo_phone(switches: dict[str, bool] | None = None, alarms=DEFAULT_ALARMS, variant: Variant = Variant()) -> SimulatedDevice:
    """A SimulatedDevice showing the demo phone's home screen."""
    return SimulatedDevice(DemoPhone(switches, alarms, variant))
