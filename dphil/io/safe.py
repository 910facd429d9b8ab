"""Making untrusted text safe for where it is written: the terminal, XML and SVG, HTML, plots.

Model names, replies, server errors and record fields come from models, providers and
files dphil does not control. Written raw to a terminal, an ESC sequence can retitle the
window, clear the screen or plant a link (OSC 8); written into SVG, a control character
makes the file ill-formed XML. Every message, table and picture passes its untrusted parts
through here.
"""

from __future__ import annotations

import base64
import hashlib
import re
from html import escape
from typing import Any

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


def for_html(text: object) -> str:
    """`text` for HTML text or a quoted attribute: escaped, control characters replaced (as XML)."""
    return for_xml(text)


def for_plot(text: object) -> str:
    """`text` for a matplotlib label: control characters shown visibly. Plots are drawn under
    `plain_text_plots` too, so a `$` in a model name is a dollar sign, never TeX (mathtext)."""
    return for_terminal(text)


def plain_text_plots(matplotlib: Any) -> None:
    """Every dphil picture is drawn with plain-text labels: no mathtext, no TeX."""
    matplotlib.rcParams["text.parse_math"] = False
    matplotlib.rcParams["text.usetex"] = False


def csp_meta(*, scripts: tuple[str, ...] = (), styles: tuple[str, ...] = (), style_attributes: bool = False) -> str:
    """A Content-Security-Policy <meta> allowing only the page's own inline scripts and styles
    (by their sha256), inline images as data: URIs, and nothing from any network.

    `style_attributes`: the page holds matplotlib's inline SVG, whose elements carry `style="..."`
    attributes that no hash can name; styles are then allowed inline (a hash beside
    'unsafe-inline' would switch it off). Scripts stay pinned by hash, and with no network
    source allowed a style cannot fetch or send anything.
    """

    def hashes(blocks: tuple[str, ...]) -> str:
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks)

    style = "'unsafe-inline'" if style_attributes else (hashes(styles) or "'none'")
    policy = [
        "default-src 'none'",
        f"script-src {hashes(scripts)}" if scripts else "script-src 'none'",
        f"style-src {style}",
        "img-src data:",
        "base-uri 'none'",
        "form-action 'none'",
    ]
    return f'<meta http-equiv="Content-Security-Policy" content="{"; ".join(policy)}">'
