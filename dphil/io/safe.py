"""Making untrusted text safe for where it is written: the terminal, XML and SVG, HTML.

Model names, replies, server errors and record fields come from models, providers and
files dphil does not control. Written raw to a terminal, an ESC sequence can retitle the
window, clear the screen or plant a link (OSC 8); written into SVG, a control character
makes the file ill-formed XML. Every message, table and picture passes its untrusted parts
through here.
"""

from __future__ import annotations

import re
from html import escape

# C0 controls but tab and newline, DEL, and the C1 controls (which some terminals obey too).
_TERMINAL_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# Characters XML 1.0 forbids outright (tab, LF and CR are allowed), and the non-characters.
_XML_FORBIDDEN = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return {0x1B: "\\e", 0x0A: "\\n", 0x0D: "\\r"}.get(code, f"\\x{code:02x}")


def for_terminal(text: object) -> str:
    """`text` for one line of a terminal: control characters shown as `\\e`, `\\x07`, `\\n`, tabs kept."""
    return _TERMINAL_UNSAFE.sub(_visible, str(text))


def for_xml(text: object) -> str:
    """`text` as XML character data or an attribute value: escaped, and forbidden characters
    replaced by U+FFFD (a standalone SVG must stay well-formed)."""
    return escape(_XML_FORBIDDEN.sub("\ufffd", str(text)), quote=True)
