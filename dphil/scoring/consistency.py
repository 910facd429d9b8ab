"""DPBench's message-action consistency: did a philosopher do what it told its neighbours?

With `--talk`, each decided turn carries `talk`, the philosopher's messages of that round
(`{"text": …}` each), sent before it acted. The intention a message states is read by one
rule: the protocol actions the message names, a name being a run of one to three words that
spells an action forgiving case, spacing, `_`, `-` and quotes (`grab-left`, `Grab Left`,
`PICK_UP_LEFT`; never a paraphrase such as "my left fork"), longest run first, runs not
overlapping. A message naming exactly one distinct action states it; one naming none or
several states nothing. A turn's intention is that of the round's last message naming any
action. Consistency is consistent turns / turns with an intention; None when there are none.
"""

from __future__ import annotations

import re
from typing import Any

from dphil.core.protocols import protocol_actions

_STRIP = " \t\r\n`*_\"'.!?:;,()[]<>{}"


def _key(words: list[str]) -> str:
    return re.sub(r"[^a-z0-9]", "", "".join(words).lower())


def actions_named(text: Any, protocol: str) -> set[str]:
    """The distinct protocol actions `text` names (see the module's rule)."""
    if not isinstance(text, str):
        return set()
    by_key = {_key([a]): a for a in protocol_actions(protocol)}
    words = [w.strip(_STRIP) for w in text.split()]
    found: set[str] = set()
    i = 0
    while i < len(words):
        for k in (3, 2, 1):
            if i + k <= len(words) and all(words[i : i + k]) and _key(words[i : i + k]) in by_key:
                found.add(by_key[_key(words[i : i + k])])
                i += k
                break
        else:
            i += 1
    return found


def stated_intention(messages: Any, protocol: str) -> str | None:
    """The action the last message naming any action states, if it names exactly one."""
    for message in reversed(messages if isinstance(messages, list) else []):
        text = message.get("text") if isinstance(message, dict) else None
        named = actions_named(text, protocol)
        if named:
            return next(iter(named)) if len(named) == 1 else None
    return None


def message_consistency(turns: Any, protocol: str) -> float | None:
    """Consistent turns / turns whose messages stated an intention; None when none did."""
    stated = consistent = 0
    for turn in turns if isinstance(turns, list) else []:
        if not isinstance(turn, dict):
            continue
        intention = stated_intention(turn.get("talk"), protocol)
        if intention is not None:
            stated += 1
            consistent += turn.get("action") == intention
    return consistent / stated if stated else None


def has_talk(record: dict[str, Any]) -> bool:
    """Whether any turn of the episode carries talk (records without it get no new field)."""
    turns = record.get("turns")
    return isinstance(turns, list) and any(isinstance(t, dict) and "talk" in t for t in turns)
