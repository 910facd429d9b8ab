"""Dijkstra's table: forks, protocols, schedules, deadlock.

Philosopher i's left fork is fork i and its right fork is fork (i+1) mod N.
The table is pure Python and does no I/O; given the same actions and the same
conflict resolution it always produces the same turns, which is what lets
`dphil-score` replay a record to check it.

Two protocols share one engine by mapping every action name to an internal
opcode: `paper` (the study's six tools) and `dpbench` (DPBench's four actions
with automatic eating and releasing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

# Opcodes shared by both protocols.
PICK_LEFT, PICK_RIGHT, PUT_LEFT, PUT_RIGHT, PUT_ALL, EAT, IDLE, NOOP = range(8)

PROTOCOLS: dict[str, dict[str, int]] = {
    "paper": {
        "pick-up-left": PICK_LEFT,
        "pick-up-right": PICK_RIGHT,
        "put-down-left": PUT_LEFT,
        "put-down-right": PUT_RIGHT,
        "eat": EAT,
        "think": IDLE,
    },
    "dpbench": {
        "grab-left": PICK_LEFT,
        "grab-right": PICK_RIGHT,
        "release": PUT_ALL,
        "wait": IDLE,
    },
}
SCHEDULES = ("simultaneous", "sequential")
CONFLICTS = ("random", "lowest-id")
DEADLOCK_MODES = ("terminal", "continue")

# Why an action did not take effect.
HELD_BY_NEIGHBOUR = "held-by-neighbour"
ALREADY_HELD = "already-held"
NOT_HOLDING = "not-holding"
NEEDS_BOTH_FORKS = "needs-both-forks"
LOST_CONFLICT = "lost-conflict"
NO_ACTION = "no-action"
REASONS = (HELD_BY_NEIGHBOUR, ALREADY_HELD, NOT_HOLDING, NEEDS_BOTH_FORKS, LOST_CONFLICT, NO_ACTION)

FREE = -1

# A conflict resolver gets (round, fork, lower_id, higher_id) and returns the winner.
Resolver = Callable[[int, int, int, int], int]


_ACTIONS = {name: tuple(codes) for name, codes in PROTOCOLS.items()}


def protocol_actions(protocol: str) -> tuple[str, ...]:
    """The action names a protocol offers, in their canonical order."""
    return _ACTIONS[protocol]


# Each protocol's explicit do-nothing action: the idle term of the reward counts it.
IDLE_ACTIONS = {"paper": "think", "dpbench": "wait"}


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
        "_right_pattern",
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
        self._codes = PROTOCOLS[protocol]
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
        self._left_pattern, self._right_pattern = _deadlock_patterns(n)

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
        if action is None:
            return NOOP
        try:
            return self._codes[action]
        except KeyError:
            raise ValueError(f"{action!r} is not a {self.protocol} action") from None

    # -- one philosopher acting alone (sequential schedule) -----------------------
    def act(self, i: int, action: str | None, extra: dict | None = None) -> dict:
        """Apply one philosopher's action immediately and record the turn."""
        ok, reason = self.apply_code(i, self.code(action))
        return self._record(i, action, ok, reason, extra)

    def apply_code(self, i: int, code: int) -> tuple[bool, str | None]:
        holder = self.holder
        if code == IDLE:
            return True, None
        if code == NOOP:
            return False, NO_ACTION
        if code in (PICK_LEFT, PICK_RIGHT):
            f = i if code == PICK_LEFT else (i + 1) % self.n
            h = holder[f]
            if h == FREE:
                holder[f] = i
                return True, None
            return False, (ALREADY_HELD if h == i else HELD_BY_NEIGHBOUR)
        if code in (PUT_LEFT, PUT_RIGHT):
            f = i if code == PUT_LEFT else (i + 1) % self.n
            if holder[f] == i:
                holder[f] = FREE
                return True, None
            return False, NOT_HOLDING
        if code == PUT_ALL:
            r = (i + 1) % self.n
            held = False
            if holder[i] == i:
                holder[i] = FREE
                held = True
            if holder[r] == i:
                holder[r] = FREE
                held = True
            if held:
                self.eating[i] = False
                return True, None
            return False, NOT_HOLDING
        # EAT
        if holder[i] == i and holder[(i + 1) % self.n] == i:
            self.meals[i] += 1
            return True, None
        return False, NEEDS_BOTH_FORKS

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
        table = self._codes
        try:
            return [NOOP if a is None else table[a] for a in actions]
        except (KeyError, TypeError):
            bad = next(a for a in actions if a is not None and a not in table)
            raise ValueError(f"{bad!r} is not a {self.protocol} action") from None

    def resolve_round(self, actions: Sequence[str | None]) -> list[dict]:
        """Apply one simultaneous round to the forks; return its turns in the order they took effect.

        Releases apply first; pick-ups are then resolved against the table as
        the releases left it, two neighbours reaching for the same free fork
        being settled by the conflict resolver; eating, idling and no-ops
        follow. Does not record the turns or end the round (see play_simultaneous).
        """
        n = self.n
        if len(actions) != n:
            raise ValueError(f"expected {n} actions, got {len(actions)}")
        codes = self.codes_of(actions)
        r = self.round
        holder = self.holder
        apply = self.apply_code
        turns: list[dict] = []
        picks: list[int] = []
        rest: list[int] = []
        for i in range(n):
            c = codes[i]
            if c <= PICK_RIGHT:
                picks.append(i)
            elif c <= PUT_ALL:
                ok, reason = apply(i, c)
                turns.append({"round": r, "philosopher": i, "action": actions[i], "ok": ok, "reason": reason})
            else:
                rest.append(i)
        if picks:
            losers: set[int] = set()
            for i in picks:
                # Fork f is contested when its right-hand user i reaches right and its
                # left-hand user f reaches left while it lies free.
                if codes[i] == PICK_RIGHT:
                    f = i + 1 if i + 1 < n else 0
                    if codes[f] == PICK_LEFT and holder[f] == FREE:
                        a, b = (i, f) if i < f else (f, i)
                        losers.add(b if self._resolve(r, f, a, b) == a else a)
            for i in picks:
                ok, reason = (False, LOST_CONFLICT) if i in losers else apply(i, codes[i])
                turns.append({"round": r, "philosopher": i, "action": actions[i], "ok": ok, "reason": reason})
        for i in rest:
            c = codes[i]
            if c == IDLE:
                ok, reason = True, None
            elif c == NOOP:
                ok, reason = False, NO_ACTION
            else:
                ok, reason = apply(i, c)
            turns.append({"round": r, "philosopher": i, "action": actions[i], "ok": ok, "reason": reason})
        return turns

    def play_simultaneous(
        self, actions: Sequence[str | None], extras: Sequence[dict | None] | None = None
    ) -> None:
        """Play one round in which everyone chose from the same snapshot, and record its turns."""
        turns = self.resolve_round(actions)
        last = self.last
        for turn in turns:
            i = turn["philosopher"]
            if extras is not None and extras[i]:
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
def _deadlock_patterns(n: int) -> tuple[list[int], list[int]]:
    """Fork holders when everyone holds exactly one fork: all their left ones, or all their right ones.

    Philosopher i can only hold fork i or i+1, so "everyone holds one fork"
    (with N forks for N people) forces one of these two patterns; comparing
    two lists is the whole deadlock check. The lists are shared and never mutated.
    """
    return list(range(n)), [(f - 1) % n for f in range(n)]


def lowest_id(_round: int, _fork: int, a: int, b: int) -> int:
    """DPBench's rule: the lower philosopher id wins a contested fork."""
    return a


def random_resolver(seed: int) -> Resolver:
    """A fair coin per conflict, fixed by (seed, round, fork).

    A counter-based hash (SplitMix64) instead of a stateful generator: each
    conflict's outcome depends only on where it happens, costs no generator
    set-up for the many episodes without conflicts, and can be recomputed
    independently of how many conflicts came before.
    """

    def resolve(rnd: int, fork: int, a: int, b: int) -> int:
        return a if coin(seed, rnd, fork) else b

    return resolve


_MASK = (1 << 64) - 1


def coin(seed: int, rnd: int, fork: int) -> bool:
    """SplitMix64 of the conflict's coordinates; True with probability 1/2."""
    z = (seed * 0x9E3779B97F4A7C15 + rnd * 0xBF58476D1CE4E5B9 + fork * 0x94D049BB133111EB) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return not (z ^ (z >> 31)) & 1
