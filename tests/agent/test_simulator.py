"""The simulated demo phone: real uiautomator XML, taps by coordinates, state, fields, records, toggles."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from edge_infer.agent.device import DeviceError
from edge_infer.agent.phone import LAUNCHER, PACKAGES, Variant, demo_phone
from edge_infer.agent.ui_tree import parse_ui_dump

UIAUTOMATOR_ATTRS = {
    "index", "text", "resource-id", "class", "package", "content-desc", "checkable", "checked", "clickable",
    "enabled", "focusable", "focused", "scrollable", "long-clickable", "password", "selected", "bounds",
}


def labels(device) -> list[str]:
    return [e.label for e in parse_ui_dump(device.dump()).elements]


def tap(device, label: str) -> None:
    element = next(e for e in parse_ui_dump(device.dump()).elements if e.label.split(" · ")[0] == label)
    device.tap(*element.center)


def test_the_dump_is_uiautomator_xml():
    device = demo_phone()
    root = ET.fromstring(device.dump().split("?>", 1)[1])
    assert root.tag == "hierarchy" and root.get("rotation") == "0"
    nodes = list(root.iter("node"))
    assert nodes and all(set(n.attrib) == UIAUTOMATOR_ATTRS for n in nodes)
    assert {n.get("package") for n in nodes} == {LAUNCHER}
    for n in nodes:
        left, top, right, bottom = map(int, n.get("bounds").replace("][", ",").strip("[]").split(","))
        assert 0 <= left <= right <= 1080 and 0 <= top <= bottom <= 2400
    assert labels(device) == ["Phone", "Messages", "Camera", "Photos", "Chrome", "Clock", "Calendar", "Settings"]
    assert device.size() == (1080, 2400)


def test_settings_network_switches_toggle_and_are_recorded():
    device = demo_phone({"bluetooth": True})
    tap(device, "Settings")
    assert parse_ui_dump(device.dump()).package == PACKAGES["settings"]
    tap(device, "Network & internet")
    screen = parse_ui_dump(device.dump())
    assert [e.render() for e in screen.elements][:5] == [
        '[0] ImageButton "Navigate up"', '[1] TextView "Network & internet"', '[2] Switch "Wi-Fi" off',
        '[3] LinearLayout "Mobile network"', '[4] Switch "Airplane mode" off',
    ]
    tap(device, "Wi-Fi")
    tap(device, "Wi-Fi")
    tap(device, "Wi-Fi")
    state = device.phone_state()
    assert state.switch("wifi") is True and state.switch("bluetooth") is True and state.switch("nfc") is None
    assert state.times_toggled("wifi") == 3 and state.times_toggled("airplane") == 0
    assert device.app.toggled == [("wifi", True), ("wifi", False), ("wifi", True)]
    assert state.has_text("Airplane mode")
    assert [r[3] for r in device.records] == ["Settings", "Network & internet", "Wi-Fi", "Wi-Fi", "Wi-Fi"]


def test_back_navigate_up_and_home():
    device = demo_phone()
    device.launch("Settings")
    tap(device, "Display")
    assert labels(device)[1:3] == ["Display", "Dark theme"]
    device.keyevent("back")
    assert labels(device)[0] == "Settings"
    tap(device, "Battery")
    tap(device, "Navigate up")
    assert labels(device)[0] == "Settings"
    device.keyevent("home")
    assert labels(device)[0] == "Phone"
    device.keyevent("back")  # the launcher stays
    assert labels(device)[0] == "Phone"
    with pytest.raises(DeviceError, match="no key"):
        device.keyevent("volume_up")


def test_launch_by_name_or_package_and_unknown_apps():
    device = demo_phone()
    device.launch("clock")
    assert parse_ui_dump(device.dump()).package == PACKAGES["clock"]
    device.launch(PACKAGES["settings"])
    assert labels(device)[0] == "Settings"
    device.launch("Camera")
    assert "This app is not part of the simulation." in labels(device)
    with pytest.raises(DeviceError, match="no app called 'Spotify'.*Settings"):
        device.launch("Spotify")
    assert device.records[-1] == ("launch", "Spotify")


def test_a_tap_on_nothing_clickable_changes_nothing():
    device = demo_phone()
    before = device.dump()
    device.tap(540, 2300)
    assert device.dump() == before and device.records == [("tap", 540, 2300, None)]


def test_add_an_alarm_with_the_time_picker():
    device = demo_phone()
    device.launch("Clock")
    assert labels(device)[:2] == ["10:08", "Wed, May 6"]
    tap(device, "Alarms")
    assert labels(device)[:3] == ["6:30 AM", "8:00 AM", "Add alarm"]
    tap(device, "Add alarm")
    picker = parse_ui_dump(device.dump())
    assert [e.render() for e in picker.elements] == [
        '[0] TextView "Set alarm"', '[1] EditText "" #hour', '[2] EditText "" #minute', '[3] RadioButton "AM" on',
        '[4] RadioButton "PM" off', '[5] Button "Cancel"', '[6] Button "Save"',
    ]
    with pytest.raises(DeviceError, match="no text field is focused"):
        device.input_text("7")
    device.tap(*picker.elements[1].center)
    device.input_text("77")
    device.keyevent("del")
    device.tap(*picker.elements[2].center)
    device.input_text("3")
    tap(device, "Save")  # 7:3 is fine, "minutes from 00 to 59"
    assert device.phone_state().alarms[-1] == ("7:03 AM", True)
    tap(device, "Add alarm")
    tap(device, "Save")
    assert "Enter an hour from 1 to 12 and minutes from 00 to 59." in labels(device)
    tap(device, "PM")
    assert parse_ui_dump(device.dump()).elements[4].checked
    tap(device, "Cancel")
    assert device.phone_state().alarms == (("6:30 AM", True), ("8:00 AM", False), ("7:03 AM", True))
    assert device.app.fields == {"hour": "", "minute": ""}
    tap(device, "6:30 AM")  # each alarm is a switch
    assert device.phone_state().alarms[0] == ("6:30 AM", False)


def test_variants_rename_reorder_and_add_decoys():
    renamed = demo_phone(variant=Variant(labels=(("network", "Connections"), ("wifi", "WLAN"))))
    renamed.launch("Settings")
    assert labels(renamed)[1] == "Connections · WLAN, Mobile network"
    tap(renamed, "Connections")
    assert "WLAN" in labels(renamed) and "Wi-Fi" not in labels(renamed)

    shuffled = [demo_phone(variant=Variant(shuffle=seed)) for seed in (3, 3, 4)]
    for device in shuffled:
        device.launch("Settings")
    first, again, other = map(labels, shuffled)
    assert first == again and first != other and sorted(first) == sorted(other)

    decoyed = demo_phone(variant=Variant(decoys=("wifi_calling", "wifi_hotspot")))
    decoyed.launch("Settings")
    tap(decoyed, "Network & internet")
    assert labels(decoyed)[2:5] == ["Wi-Fi calling", "Wi-Fi", "Wi-Fi hotspot"]


def test_unknown_start_switches_are_refused():
    with pytest.raises(ValueError, match="unknown switches"):
        demo_phone({"nfc": True})
