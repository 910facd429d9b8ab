"""The turn dicts of the hot loop, built once per (protocol, round, philosopher, opcode, outcome).

`Table.resolve_round` and `Table.resolve_sequential_round` (`dphil.core.table`) take
each turn from here rather than building it: the cache is shared by every table in the
process and never cleared.
"""

from __future__ import annotations

import orjson

from dphil.core.protocols import _REASON_OF, OK, PROTOCOLS

# Building a five-key dict is the largest single cost of a round, so each distinct
# turn of a (protocol, round) is built once and kept in a slot by [philosopher]
# [opcode][outcome]: rollouts copy it out (a copy is half the price), replays
# compare recorded turns with it without copying. Slots are never handed out
# uncopied to code that could change them. Only the first _CACHED_ROUNDS rounds
# of tables up to _CACHED_N philosophers are kept (a few MB at most, never
# cleared, so threads cannot race a clear); beyond them turns are built afresh.
_CACHED_ROUNDS = 64
_CACHED_N = 64
_SLOTS: dict[str, list[list[list[list[dict | None]]] | None]] = {
    protocol: [None] * (_CACHED_ROUNDS + 1) for protocol in PROTOCOLS
}
_UNCACHED: tuple[tuple[None, ...], ...] = ((None,) * 8,) * 8  # a philosopher's slots that keep nothing
_NAMES = {
    protocol: tuple(next((a for a, c in codes.items() if c == k), None) for k in range(8))
    for protocol, codes in PROTOCOLS.items()
}


def _turn_slots(protocol: str, rnd: int, n: int) -> list:
    """The turn slots of one protocol's round, for at least n philosophers."""
    if rnd > _CACHED_ROUNDS or n > _CACHED_N:
        return [_UNCACHED] * n
    by_round = _SLOTS[protocol]
    slots = by_round[rnd]
    if slots is None or len(slots) < n:
        have = slots or []
        slots = by_round[rnd] = have + [[[None] * 8 for _ in range(8)] for _ in range(len(have), n)]
    return slots


def _new_turn(slots: list, protocol: str, rnd: int, i: int, code: int, out: int) -> dict:
    turn = {
        "round": rnd,
        "philosopher": i,
        "action": _NAMES[protocol][code],
        "ok": out == OK,
        "reason": _REASON_OF[out],
    }
    row = slots[i]
    if row is _UNCACHED:
        return turn
    turn = orjson.loads(orjson.dumps(turn))  # keys as orjson's cached strings: a parsed turn compares by identity
    row[code][out] = turn
    return turn
