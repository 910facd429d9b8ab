"""Dijkstra's table: forks, protocols, schedules, deadlock.

Philosopher i's left fork is fork i and its right fork is fork (i+1) mod N.
The table is pure Python and does no I/O; given the same actions and the same
conflict resolution it always produces the same turns, which is what lets
`dphil-score` replay a record to check it.

Two protocols share one engine by mapping every action name to an internal
opcode (`dphil.core.protocols`): `paper` (the study's six tools) and `dpbench`
(DPBench's four actions with automatic eating and releasing); who wins a
contested fork is the conflict resolver's call (`dphil.core.conflicts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from dphil.core.conflicts import Resolver, lowest_id
from dphil.core.protocols import (
    _OPCODES,
    _REASON_OF,
    DEADLOCK_MODES,
    IDLE,
    NOOP,
    O_ALREADY_HELD,
    O_HELD_BY_NEIGHBOUR,
    O_LOST_CONFLICT,
    O_NEEDS_BOTH_FORKS,
    O_NO_ACTION,
    O_NOT_HOLDING,
    OK,
    PICK_LEFT,
    PICK_RIGHT,
    PROTOCOLS,
    PUT_ALL,
    PUT_LEFT,
    PUT_RIGHT,
)
from dphil.core.turn_cache import _CACHED_ROUNDS, _SLOTS, _new_turn, _turn_slots

FREE = -1


@dataclass(frozen=True, slots=True)
class Observation:
    """What one philosopher can see when it chooses: the input of an agent's prompt."""

    philosopher: int
    n: int
    round: int
    rounds: int
    protocol: str
    holds_left: bool
    holds_right: bool
    left_free: bool
    right_free: bool
    meals: int
    eating: bool
    last_action: str | None
    last_ok: bool | None
    last_reason: str | None


class Table:
    """The state of one episode's table, advanced one round (or one turn) at a time.

    `turns` collects one dict per action in the order the actions took effect;
    `events` collects what the table did on its own (DPBench's automatic
    eating and releasing, forced releases after a deadlock).
    """

    __slots__ = (
        "_codes",
        "_left_pattern",
        "_resolve",
        "_right",
        "_right_pattern",
        "_slots",
        "deadlock_mode",
        "deadlock_rounds",
        "eating",
        "events",
        "holder",
        "last",
        "meals",
        "n",
        "over",
        "protocol",
        "round",
        "rounds",
        "turns",
    )

    def __init__(
        self,
        n: int,
        rounds: int,
        *,
        protocol: str = "paper",
        deadlock_mode: str = "terminal",
        resolve: Resolver | None = None,
    ) -> None:
        if n < 2:
            raise ValueError("a table needs at least 2 philosophers")
        if rounds < 1:
            raise ValueError("an episode needs at least 1 round")
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}")
        if deadlock_mode not in DEADLOCK_MODES:
            raise ValueError(f"unknown deadlock mode {deadlock_mode!r}")
        self.n = n
        self.rounds = rounds
        self.protocol = protocol
        self.deadlock_mode = deadlock_mode
        self._codes = _OPCODES[protocol]
        self._resolve = resolve or lowest_id
        self.holder = [FREE] * n
        self.meals = [0] * n
        self.eating = [False] * n
        self.last: list[dict | None] = [None] * n
        self.turns: list[dict] = []
        self.events: list[dict] = []
        self.deadlock_rounds: list[int] = []
        self.round = 1
        self.over = False
        self._left_pattern, self._right_pattern, self._right = _geometry(n)
        self._slots = _SLOTS[protocol]

    # -- what a philosopher sees -------------------------------------------------
    def observe(self, i: int) -> Observation:
        n = self.n
        holder = self.holder
        left, right = holder[i], holder[(i + 1) % n]
        last = self.last[i]
        return Observation(
            philosopher=i,
            n=n,
            round=self.round,
            rounds=self.rounds,
            protocol=self.protocol,
            holds_left=left == i,
            holds_right=right == i,
            left_free=left == FREE,
            right_free=right == FREE,
            meals=self.meals[i],
            eating=self.eating[i],
            last_action=last["action"] if last else None,
            last_ok=last["ok"] if last else None,
            last_reason=last["reason"] if last else None,
        )

    def code(self, action: str | None) -> int:
        """The opcode of an action name; ValueError if the protocol has no such action."""
        try:
            return self._codes[action]
        except (KeyError, TypeError):
            raise ValueError(f"{action!r} is not a {self.protocol} action") from None

    # -- one philosopher acting alone (sequential schedule) -----------------------
    def act(self, i: int, action: str | None, extra: dict | None = None) -> dict:
        """Apply one philosopher's action immediately and record the turn."""
        out = self.apply_code(i, self.code(action))
        return self._record(i, action, out == OK, _REASON_OF[out], extra)

    def apply_code(self, i: int, code: int) -> int:
        """Apply one philosopher's action alone; return its outcome code (OK or why not)."""
        holder = self.holder
        if code == IDLE:
            return OK
        if code == NOOP:
            return O_NO_ACTION
        if code <= PICK_RIGHT:
            f = i if code == PICK_LEFT else self._right[i]
            h = holder[f]
            if h == FREE:
                holder[f] = i
                return OK
            return O_ALREADY_HELD if h == i else O_HELD_BY_NEIGHBOUR
        if code <= PUT_RIGHT:
            f = i if code == PUT_LEFT else self._right[i]
            if holder[f] == i:
                holder[f] = FREE
                return OK
            return O_NOT_HOLDING
        if code == PUT_ALL:
            f = self._right[i]
            out = O_NOT_HOLDING
            if holder[i] == i:
                holder[i] = FREE
                out = OK
            if holder[f] == i:
                holder[f] = FREE
                out = OK
            if out == OK:
                self.eating[i] = False
            return out
        # EAT
        if holder[i] == i and holder[self._right[i]] == i:
            self.meals[i] += 1
            return OK
        return O_NEEDS_BOTH_FORKS

    def _record(self, i: int, action: str | None, ok: bool, reason: str | None, extra) -> dict:
        turn = {"round": self.round, "philosopher": i, "action": action, "ok": ok, "reason": reason}
        if extra:
            turn.update(extra)
        self.turns.append(turn)
        self.last[i] = turn
        return turn

    # -- everyone at once (simultaneous schedule) --------------------------------
    def codes_of(self, actions: Sequence[str | None]) -> list[int]:
        """Opcodes for one round's actions; ValueError names an action the protocol lacks."""
        if len(actions) != self.n:
            raise ValueError(f"expected {self.n} actions, got {len(actions)}")
        table = self._codes
        try:
            return list(map(table.__getitem__, actions))
        except (KeyError, TypeError):
            for action in actions:
                self.code(action)  # raises for the first action the protocol lacks
            raise

    def resolve_round(self, actions: Sequence[str | None], *, copy: bool = True) -> list[dict]:
        """Apply one simultaneous round to the forks; return its turns in the order they took effect.

        Releases apply first; pick-ups are then resolved against the table as
        the releases left it, two neighbours reaching for the same free fork
        being settled by the conflict resolver; eating, idling and no-ops
        follow. Does not record the turns or end the round (see play_simultaneous).
        With `copy=False` the turns are shared, read-only dicts: cheaper, for
        comparing with recorded turns only.
        """
        n = self.n
        codes = self.codes_of(actions)
        # The rules are written out here rather than calling `apply_code` per
        # philosopher: this is the hot loop of rollouts and replays. A property
        # test holds the two to the same outcomes.
        r = self.round
        protocol = self.protocol
        slots = self._slots[r] if r <= _CACHED_ROUNDS else None
        if slots is None or len(slots) < n:
            slots = _turn_slots(protocol, r, n)
        holder = self.holder
        right = self._right
        settled: list[dict] = []
        add = settled.append
        picks: list[int] = []
        rest: list[int] = []
        for i, c in enumerate(codes):
            if c <= PICK_RIGHT:
                picks.append(i)
            elif c > PUT_ALL:
                rest.append(i)
            elif c == PUT_ALL:  # (dpbench) release every fork held
                out = self.apply_code(i, c)
                add(slots[i][c][out] or _new_turn(slots, protocol, r, i, c, out))
            else:  # put down one fork
                f = i if c == PUT_LEFT else right[i]
                if holder[f] == i:
                    holder[f] = FREE
                    add(slots[i][c][OK] or _new_turn(slots, protocol, r, i, c, OK))
                else:
                    add(slots[i][c][O_NOT_HOLDING] or _new_turn(slots, protocol, r, i, c, O_NOT_HOLDING))
        if picks:
            losers: tuple[int, ...] = ()
            for i in picks:
                # Fork f is contested when its right-hand user i reaches right and its
                # left-hand user f reaches left while it lies free.
                if codes[i] == PICK_RIGHT:
                    f = right[i]
                    if codes[f] == PICK_LEFT and holder[f] == FREE:
                        a, b = (i, f) if i < f else (f, i)
                        losers = (*losers, b if self._resolve(r, f, a, b) == a else a)
            for i in picks:
                c = codes[i]
                if i in losers:
                    add(slots[i][c][O_LOST_CONFLICT] or _new_turn(slots, protocol, r, i, c, O_LOST_CONFLICT))
                    continue
                f = i if c == PICK_LEFT else right[i]
                h = holder[f]
                if h == FREE:
                    holder[f] = i
                    add(slots[i][c][OK] or _new_turn(slots, protocol, r, i, c, OK))
                else:
                    out = O_ALREADY_HELD if h == i else O_HELD_BY_NEIGHBOUR
                    add(slots[i][c][out] or _new_turn(slots, protocol, r, i, c, out))
        for i in rest:
            c = codes[i]
            if c == IDLE:
                add(slots[i][c][OK] or _new_turn(slots, protocol, r, i, c, OK))
            elif c == NOOP:
                add(slots[i][c][O_NO_ACTION] or _new_turn(slots, protocol, r, i, c, O_NO_ACTION))
            elif holder[i] == i and holder[right[i]] == i:  # eat with both forks
                self.meals[i] += 1
                add(slots[i][c][OK] or _new_turn(slots, protocol, r, i, c, OK))
            else:
                add(slots[i][c][O_NEEDS_BOTH_FORKS] or _new_turn(slots, protocol, r, i, c, O_NEEDS_BOTH_FORKS))
        return [t.copy() for t in settled] if copy else settled

    def resolve_sequential_round(self, actions: Sequence[str | None], *, copy: bool = True) -> list[dict]:
        """Apply one sequential round, philosophers 0..N-1 in turn; return its turns unrecorded.

        The replay counterpart of calling `act` for each philosopher: nothing is
        recorded and the round is not ended. `copy` as in `resolve_round`.
        """
        apply = self.apply_code
        r = self.round
        protocol = self.protocol
        slots = _turn_slots(protocol, r, self.n)
        turns = []
        for i, c in enumerate(self.codes_of(actions)):
            out = apply(i, c)
            turns.append(slots[i][c][out] or _new_turn(slots, protocol, r, i, c, out))
        return [t.copy() for t in turns] if copy else turns

    def play_simultaneous(
        self, actions: Sequence[str | None], extras: Sequence[dict | None] | None = None, *, copy: bool = True
    ) -> None:
        """Play one round in which everyone chose from the same snapshot, and record its turns.

        `copy=False` records shared, read-only turn dicts (see resolve_round): only
        for a table whose turns are serialised and dropped, never handed out.
        """
        turns = self.resolve_round(actions, copy=copy or extras is not None)
        last = self.last
        if extras is None:
            for turn in turns:
                last[turn["philosopher"]] = turn
        else:
            for turn in turns:
                i = turn["philosopher"]
                if extras[i]:
                    turn.update(extras[i])
                last[i] = turn
        self.turns.extend(turns)
        self.end_round()

    # -- the end of every round ---------------------------------------------------
    def end_round(self) -> bool:
        """Apply the protocol's automatic effects, check for deadlock, advance the round.

        Returns True when the table deadlocked this round.
        """
        r = self.round
        holder = self.holder
        if self.protocol == "dpbench":
            n = self.n
            eating = self.eating
            for i in range(n):
                if eating[i]:
                    eating[i] = False
                    if holder[i] == i:
                        holder[i] = FREE
                    if holder[(i + 1) % n] == i:
                        holder[(i + 1) % n] = FREE
                    self.events.append({"round": r, "philosopher": i, "event": "auto-release"})
            for i in range(n):
                if holder[i] == i and holder[(i + 1) % n] == i:
                    self.meals[i] += 1
                    eating[i] = True
                    self.events.append({"round": r, "philosopher": i, "event": "auto-eat"})
        deadlock = holder == self._left_pattern or holder == self._right_pattern
        if deadlock:
            self.deadlock_rounds.append(r)
            if self.deadlock_mode == "terminal":
                self.over = True
            elif self.protocol == "dpbench":
                for f in range(self.n):
                    holder[f] = FREE
                self.events.append({"round": r, "philosopher": None, "event": "force-release"})
        if r >= self.rounds:
            self.over = True
        if not self.over:
            self.round = r + 1
        return deadlock

    @property
    def rounds_played(self) -> int:
        return self.round


@lru_cache(maxsize=64)
def _geometry(n: int) -> tuple[list[int], list[int], list[int]]:
    """Per table size: the two deadlock patterns, and each philosopher's right fork (i+1) mod n.

    Philosopher i can only hold fork i or i+1, so "everyone holds one fork"
    (with N forks for N people) forces one of two patterns of fork holders:
    all hold their left forks, or all their right ones; comparing two lists is
    the whole deadlock check. The lists are shared and never mutated.
    """
    return list(range(n)), [(f - 1) % n for f in range(n)], [*range(1, n), 0]
