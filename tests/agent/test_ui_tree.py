"""Reading uiautomator dumps: elements, labels, rendering, signatures, and hostile input."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from edge_infer.agent import ui_tree
from edge_infer.agent.ui_tree import UiDumpError, parse_ui_dump, render_tree, screen_signature


def node(cls="android.widget.FrameLayout", text="", desc="", rid="", bounds="[0,0][1080,2400]", children="", **flags):
    attrs = {"checkable": "false", "checked": "false", "clickable": "false", "enabled": "true", "long-clickable": "false"}
    attrs.update({k.replace("_", "-"): str(v).lower() for k, v in flags.items()})
    flag_text = " ".join(f'{k}="{v}"' for k, v in attrs.items())
    return (f'<node index="0" text="{text}" resource-id="{rid}" class="{cls}" package="com.android.settings" '
            f'content-desc="{desc}" {flag_text} bounds="{bounds}">{children}</node>')


def dump(*nodes: str) -> str:
    return "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\">" + node(children="".join(nodes)) + "</hierarchy>"


# A Settings screen as Android writes it: rows are clickable layouts, their titles and switches are children.
WIFI_ROW = node("android.widget.LinearLayout", bounds="[0,300][1080,468]", clickable=True, children=(
    node("android.widget.TextView", text="Wi-Fi", rid="android:id/title", bounds="[40,320][800,400]")
    + node("android.widget.TextView", text="HomeNet", rid="android:id/summary", bounds="[40,400][800,460]")
    + node("android.widget.Switch", rid="android:id/switch_widget", bounds="[900,340][1040,420]", checkable=True, checked=True)
))
SETTINGS = dump(
    node("android.widget.TextView", text="Network &amp; internet", bounds="[40,120][1040,280]"),
    WIFI_ROW,
    node("android.widget.LinearLayout", bounds="[0,468][1080,636]", clickable=True, enabled=False, children=(
        node("android.widget.TextView", text="Airplane mode", bounds="[40,480][800,600]")
        + node("android.widget.Switch", bounds="[900,500][1040,580]", checkable=True)
    )),
    node("android.widget.TextView", text="hidden", bounds="[0,0][0,0]"),
    node("android.widget.EditText", rid="com.android.settings:id/search", bounds="[0,700][1080,800]", clickable=True),
    node("android.widget.LinearLayout", bounds="[0,800][1080,960]", clickable=True, children=(
        node("android.widget.TextView", text="Saved networks", bounds="[40,820][800,900]")
        + node("android.widget.ImageButton", desc="Forget", bounds="[900,820][1040,900]", clickable=True)
    )),
)


def test_rows_take_their_childrens_texts_and_switch_state():
    screen = parse_ui_dump(SETTINGS)
    assert [e.render() for e in screen.elements] == [
        '[0] TextView "Network & internet"',
        '[1] Switch "Wi-Fi · HomeNet" on',
        '[2] Switch "Airplane mode" off disabled',
        '[3] EditText "" #search',
        '[4] LinearLayout "Saved networks"',
        '[5] ImageButton "Forget"',  # a clickable child of a row stays its own element
    ]
    wifi = screen.elements[1]
    assert (wifi.checkable, wifi.checked, wifi.clickable, wifi.enabled) == (True, True, True, True)
    assert wifi.bounds == (0, 300, 1080, 468) and wifi.center == (540, 384)
    assert screen.elements[3].editable and screen.elements[3].short_id == "search"
    assert screen.package == "com.android.settings"
    assert render_tree(SETTINGS) == screen.render()


def test_max_elements_caps_the_list_and_says_how_many_more():
    rows = [node("android.widget.Button", text=f"b{i}", bounds=f"[0,{i * 10}][100,{i * 10 + 10}]", clickable=True) for i in range(8)]
    screen = parse_ui_dump(dump(*rows), max_elements=3)
    assert [e.label for e in screen.elements] == ["b0", "b1", "b2"] and screen.omitted == 5
    assert screen.render().endswith("(5 more elements not shown)")


def test_signature_ignores_coordinates_but_not_labels_or_checked_state():
    moved = SETTINGS.replace("[0,300][1080,468]", "[0,310][1080,478]")
    assert screen_signature(moved) == screen_signature(SETTINGS)
    assert screen_signature(SETTINGS.replace('checked="true"', 'checked="false"')) != screen_signature(SETTINGS)
    assert screen_signature(SETTINGS.replace("HomeNet", "Office")) != screen_signature(SETTINGS)


def test_output_around_the_xml_is_ignored():
    # `adb exec-out uiautomator dump /dev/tty` prints the XML and then a line of its own.
    assert parse_ui_dump(SETTINGS + "UI hierchary dumped to: /dev/tty\n").elements[1].label == "Wi-Fi · HomeNet"


def test_long_labels_are_clipped_and_quotes_replaced():
    screen = parse_ui_dump(dump(node("android.widget.TextView", text="x" * 100 + ' say &quot;hi&quot;', bounds="[0,0][10,10]")))
    line = screen.elements[0].render()
    assert len(line) < 90 and line.endswith('…"') and '"hi"' not in line


@pytest.mark.parametrize(("xml", "message"), [
    ("", "empty"),
    ("   \n", "empty"),
    ("ERROR: null root node returned by UiTestAutomationBridge.", "no XML"),
    ("<hierarchy><node text='a' bounds='[0,0][1,1]'>", "not well-formed"),
    ("<hierarchy></hierarchy>", "no <node>"),
    ("<html><body/></html>", "root is <html>"),
    ('<!DOCTYPE h [<!ENTITY a "aaaa">]><hierarchy><node text="&a;"/></hierarchy>', "DTD"),
    ("<hierarchy>" + "<node>" * 500 + "</node>" * 500 + "</hierarchy>", "levels deep"),
])
def test_malformed_dumps_raise_a_clear_error(xml, message):
    with pytest.raises(UiDumpError, match=message):
        parse_ui_dump(xml)


def test_a_huge_dump_is_refused_before_parsing():
    huge = dump(node(text="x" * (ui_tree.MAX_DUMP_BYTES + 1)))
    with pytest.raises(UiDumpError, match="over the"):
        parse_ui_dump(huge)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.binary(max_size=300),
    st.text(alphabet="<>/=\"' nodehiracybutsx[],0123456789&;!-", max_size=300),
    st.integers(0, len(SETTINGS)).map(lambda n: SETTINGS[:n]),
))
def test_garbage_gives_a_screen_or_a_ui_dump_error_never_another_exception(raw):
    try:
        parse_ui_dump(raw)
    except UiDumpError:
        pass
