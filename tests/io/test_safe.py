"""Untrusted text made safe for a terminal and for XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from dphil.io.safe import for_terminal, for_xml

HOSTILE = "m\x1b]0;owned\x07\x1b[2J\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\x9b31m\x00\r\nend\tok"


def test_terminal_text_has_no_control_character_but_tab():
    shown = for_terminal(HOSTILE)
    assert not any((ord(c) < 0x20 and c != "\t") or 0x7F <= ord(c) <= 0x9F for c in shown)
    assert shown.startswith("m\\e]0;owned\\x07\\e[2J") and shown.endswith("\\r\\nend\tok")


def test_xml_text_parses_and_keeps_what_xml_allows():
    svg = f'<svg xmlns="http://www.w3.org/2000/svg"><text title="{for_xml(HOSTILE)}">{for_xml(HOSTILE)}</text></svg>'
    root = ET.fromstring(svg)
    text = root[0].text
    assert "\x1b" not in text and "\ufffd" in text and text.endswith("end\tok")
