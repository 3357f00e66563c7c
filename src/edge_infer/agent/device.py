"""Phones the agent can operate: the ``Device`` protocol and ``AdbDevice`` over the ``adb`` tool.

Every action is in screen coordinates or key names, the way ``adb shell
input`` takes them, so a simulated phone and a real one are driven by the
same executor. Failures raise ``DeviceError`` with what went wrong; the
executor turns it into a sentence for the model.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from typing import Protocol

from edge_infer.errors import EdgeInferError

# Key names the executor uses -> Android key codes.
KEYCODES = {
    "back": "KEYCODE_BACK", "home": "KEYCODE_HOME", "enter": "KEYCODE_ENTER",
    "del": "KEYCODE_DEL", "move_end": "KEYCODE_MOVE_END",
}

# App names a model may say -> the packages of stock Android (Pixel) apps; other names are looked up.
APP_PACKAGES = {
    "settings": "com.android.settings",
    "clock": "com.google.android.deskclock",
    "phone": "com.google.android.dialer",
    "messages": "com.google.android.apps.messaging",
    "camera": "com.android.camera2",
    "photos": "com.google.android.apps.photos",
    "chrome": "com.android.chrome",
    "calendar": "com.google.android.calendar",
    "maps": "com.google.android.apps.maps",
    "contacts": "com.google.android.contacts",
}


class DeviceError(EdgeInferError, RuntimeError):
    """The device could not do what was asked (no adb, no such app, a command failed)."""


class Device(Protocol):
    def dump(self) -> str: ...  # uiautomator XML of the current screen
    def tap(self, x: int, y: int) -> None: ...
    def input_text(self, text: str) -> None: ...  # into the focused field
    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None: ...
    def keyevent(self, key: str) -> None: ...  # a name in KEYCODES
    def launch(self, app: str) -> None: ...  # an app's name or package
    def size(self) -> tuple[int, int]: ...


def input_text_arg(text: str) -> str:
    """``text`` as one argument of ``adb shell input text``.

    adb joins shell arguments into one command line for the device's shell,
    so the text is quoted for that shell; ``input text`` reads ``%s`` as a
    space and cannot type a literal space.
    """
    if not text:
        raise DeviceError("there is no text to type")
    if not text.isascii() or not text.isprintable():
        raise DeviceError(f"adb's `input text` types printable ASCII only, and {text!r} is not")
    return shlex.quote(text.replace(" ", "%s"))


class AdbDevice:
    """A phone (or emulator) reached with ``adb``; ``serial`` picks one when several are attached."""

    def __init__(self, serial: str | None = None, adb: str = "adb", timeout_s: float = 30.0):
        path = shutil.which(adb)
        if path is None:
            raise DeviceError(f"{adb!r} is not on PATH; install Android platform-tools or pass the adb executable's path")
        self.base = [path] + (["-s", serial] if serial else [])
        self.timeout_s = timeout_s

    def adb(self, *args: str) -> str:
        """Run one adb command and return its stdout."""
        try:
            proc = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise DeviceError(f"`adb {' '.join(args)}` did not finish within {self.timeout_s:g} s; is the device awake?") from None
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise DeviceError(f"`adb {' '.join(args)}` failed (exit {proc.returncode}): {detail[-1] if detail else 'no output'}")
        return proc.stdout

    def dump(self) -> str:
        out = self.adb("exec-out", "uiautomator", "dump", "/dev/tty")
        if "<hierarchy" not in out:
            raise DeviceError(f"uiautomator returned no hierarchy: {out.strip()[:200] or 'no output'}")
        return out

    def tap(self, x: int, y: int) -> None:
        self.adb("shell", "input", "tap", str(x), str(y))

    def input_text(self, text: str) -> None:
        self.adb("shell", "input", "text", input_text_arg(text))

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None:
        self.adb("shell", "input", "swipe", *map(str, (x1, y1, x2, y2, duration_ms)))

    def keyevent(self, key: str) -> None:
        if key not in KEYCODES:
            raise DeviceError(f"unknown key {key!r}; known: {', '.join(KEYCODES)}")
        self.adb("shell", "input", "keyevent", KEYCODES[key])

    def launch(self, app: str) -> None:
        package = self.package_of(app)
        out = self.adb("shell", "monkey", "-p", package, "-c", "android.intent.category.LAUNCHER", "1")
        if "No activities found" in out or "aborted" in out:
            raise DeviceError(f"{package} has no launcher activity to start")

    def package_of(self, app: str) -> str:
        name = app.strip().lower()
        if name in APP_PACKAGES:
            return APP_PACKAGES[name]
        if re.fullmatch(r"[a-z][\w]*(\.[\w]+)+", name):
            return name
        installed = [line.removeprefix("package:").strip() for line in self.adb("shell", "pm", "list", "packages").splitlines()]
        key = name.replace(" ", "")
        matches = [p for p in installed if key and key in p.rpartition(".")[2]]
        if len(matches) != 1:
            found = f"several match: {', '.join(matches[:5])}" if matches else "none matches"
            raise DeviceError(f"no single app is named {app!r} ({found}); give its package name")
        return matches[0]

    def size(self) -> tuple[int, int]:
        out = self.adb("shell", "wm", "size")
        sizes = re.findall(r"(\d+)x(\d+)", out)  # "Physical size: WxH", then "Override size: WxH" when set
        if not sizes:
            raise DeviceError(f"cannot read the screen size from `wm size`: {out.strip()[:100]!r}")
        width, height = sizes[-1]
        return int(width), int(height)

    def global_setting(self, name: str) -> str:
        return self.adb("shell", "settings", "get", "global", name).strip()
