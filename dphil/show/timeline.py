"""An episode at a glance: who held which fork, who ate, who failed, round by round.

`timeline` walks a record's turns through the engine (`dphil.core.table`), so the
grid shows what the table did rather than re-deriving the rules; the recorded
outcome of every turn must agree with it. `render_text` draws the grid for a
terminal or a pipe; `dphil.show.svg` draws it as a picture (`episode_svg`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dphil.core.episode import recorded_winner
from dphil.core.protocols import NO_ACTION, OK, REASONS
from dphil.core.records import check_episode, is_int
from dphil.core.table import Table
from dphil.io.errors import DataError
from dphil.io.safe import for_terminal
from dphil.scoring.reward import TERMS

# A philosopher's state in one round, after the round's actions took effect.
THINKING, LEFT, RIGHT, BOTH, EATING = "thinking", "left", "right", "both", "eating"
STATES = (THINKING, LEFT, RIGHT, BOTH, EATING)
STATE_TEXT = {
    THINKING: "holds no fork",
    LEFT: "holds the left fork",
    RIGHT: "holds the right fork",
    BOTH: "holds both forks",
    EATING: "eats",
}


@dataclass(frozen=True, slots=True)
class Cell:
    """One philosopher in one round: the state the round left and the recorded turn (None: no turn yet)."""

    state: str
    turn: dict[str, Any] | None
    index: int | None  # the turn's position in the record's `turns`

    @property
    def null(self) -> bool:
        """The turn had no readable action (`action: null`)."""
        return self.turn is not None and self.turn.get("action") is None

    @property
    def failed(self) -> bool:
        """The turn named an action that did not take effect."""
        return self.turn is not None and not self.turn.get("ok") and self.turn.get("reason") != NO_ACTION

    @property
    def missing(self) -> bool:
        """No turn was recorded (the round an errored episode stopped in)."""
        return self.turn is None


@dataclass(frozen=True, slots=True)
class Timeline:
    """The grid of one episode: `cells[philosopher][round - 1]` for every round played."""

    record: dict[str, Any]
    n: int
    rounds: int
    cells: list[list[Cell]]
    deadlock_rounds: tuple[int, ...]
    meals: tuple[int, ...]

    @property
    def rounds_played(self) -> int:
        return len(self.cells[0]) if self.cells else 0


def timeline(record: dict[str, Any]) -> Timeline:
    """The state grid of an episode record; DataError when its turns are not what the table does."""
    check_episode(record)
    n, rounds, protocol = record["n"], record["rounds"], record["protocol"]
    turns = record["turns"]
    if n > max(len(turns), _MAX_IDLE_SEATS):  # every round played holds n turns: n is a lie
        raise DataError(f"a table of {n} philosophers with only {len(turns)} turns recorded")
    chunk: list = []
    try:
        table = Table(
            n,
            rounds,
            protocol=protocol,
            deadlock_mode=record.get("deadlock_mode", "terminal"),
            resolve=recorded_winner(record, chunk),
        )
    except ValueError as e:
        raise DataError(str(e)) from None
    sequential = record["schedule"] == "sequential"
    columns: list[list[Cell]] = []
    total = len(turns)
    k = 0
    while k < total:
        r = table.round
        if table.over:
            raise DataError(f"the episode ended at round {r} but turns[{k}] continues it")
        chunk[:] = _round_turns(turns, k, r, n)
        seats: list[int | None] = [None] * n
        for j, t in enumerate(chunk, k):
            seats[t["philosopher"]] = j
        partial = len(chunk) < n
        if partial:
            if not (sequential and record["status"] == "error" and k + len(chunk) == total):
                missing = [i for i in range(n) if seats[i] is None]
                raise DataError(f"round {r}: no turn for philosopher(s) {missing}")
            outcomes = [(t["philosopher"], table.apply_code(t["philosopher"], _code(table, t, r))) for t in chunk]
            got = [(i, out == OK, None if out == OK else REASONS[out - 1]) for i, out in outcomes]
        else:
            actions: list = [None] * n
            for t in chunk:
                actions[t["philosopher"]] = t.get("action")
            try:
                played = (table.resolve_sequential_round if sequential else table.resolve_round)(actions, copy=False)
            except ValueError as e:
                raise DataError(f"round {r}: {e}") from None
            got = [(t["philosopher"], t["ok"], t["reason"]) for t in played]
        for j, (want, (i, ok, reason)) in enumerate(zip(chunk, got, strict=True), k):
            if want["philosopher"] != i or want.get("ok") is not ok or want.get("reason") != reason:
                raise DataError(
                    f"turns[{j}] disagrees with the table: philosopher {want['philosopher']} "
                    f"{want.get('action') or 'null'} ok={want.get('ok')} reason={want.get('reason')}; "
                    f"the table gives philosopher {i} ok={ok} reason={reason}"
                )
        holder = table.holder[:]  # before end_round releases anything
        ate = [False] * n
        if protocol == "paper":  # eating is an action; in dpbench it is the table's auto-eat event
            for t in chunk:
                if t["ok"] and t.get("action") == "eat":
                    ate[t["philosopher"]] = True
        if not partial:
            seen = len(table.events)
            table.end_round()
            for event in table.events[seen:]:
                if event.get("event") == "auto-eat":
                    ate[event["philosopher"]] = True
        column = []
        for i in range(n):
            hl, hr = holder[i] == i, holder[(i + 1) % n] == i
            state = EATING if ate[i] else BOTH if hl and hr else LEFT if hl else RIGHT if hr else THINKING
            seat = seats[i]
            column.append(Cell(state, None if seat is None else turns[seat], seat))
        columns.append(column)
        k += len(chunk)
        if partial:
            break
    cells = [[col[i] for col in columns] for i in range(n)]
    meals = record.get("meals")
    recorded_meals = tuple(meals) if isinstance(meals, list) and all(is_int(m) for m in meals) else tuple(table.meals)
    return Timeline(record, n, rounds, cells, tuple(table.deadlock_rounds), recorded_meals)


_MAX_IDLE_SEATS = 10_000  # the largest table drawn without a turn for every seat (an errored episode)


def _round_turns(turns: list, k: int, r: int, n: int) -> list[dict]:
    """The turns of round r starting at turns[k], checked to be one per philosopher at most."""
    chunk: list[dict] = []
    seen = 0
    for j in range(k, min(k + n, len(turns))):
        t = turns[j]
        if type(t) is not dict:
            raise DataError(f"turns[{j}] should be an object")
        try:
            rnd, i, _, _ = t["round"], t["philosopher"], t["action"], t["ok"]
        except KeyError as e:
            raise DataError(f"turns[{j}] is missing field {e.args[0]!r}") from None
        if rnd != r:
            if chunk and rnd == r + 1:
                break
            raise DataError(f"turns[{j}] is in round {rnd!r}; expected round {r}")
        if not is_int(i) or not 0 <= i < n:
            raise DataError(f"turns[{j}] has philosopher {i!r} outside the table of {n}")
        if seen >> i & 1:
            raise DataError(f"philosopher {i} acts twice in round {r}")
        seen |= 1 << i
        chunk.append(t)
    return chunk


def _code(table: Table, turn: dict, r: int) -> int:
    try:
        return table.code(turn.get("action"))
    except ValueError as e:
        raise DataError(f"round {r}: {e}") from None


# -- words shared by the text and the picture --------------------------------------------------


def describe(record: dict[str, Any]) -> str:
    """One line naming the episode: model, table size, seed, rules."""
    parts = [
        str(record.get("model", "?")),
        f"N={record['n']}",
        f"seed {record.get('seed')}",
        f"protocol {record['protocol']}, {record['schedule']}",
    ]
    for key in ("prompt", "run", "checkpoint_step"):
        if record.get(key) is not None:
            parts.append(f"{key.replace('_', ' ')} {record[key]}")
    return for_terminal(" · ".join(parts))  # record fields: no raw control characters


def outcome_text(tl: Timeline) -> str:
    """One line saying how the episode went."""
    rec = tl.record
    parts = []
    if rec.get("status") == "error":
        parts.append(f"error: {rec.get('error') or 'unknown'}")
    if tl.deadlock_rounds:
        plural = "s" if len(tl.deadlock_rounds) > 1 else ""
        parts.append(f"deadlock in round{plural} {spans(tl.deadlock_rounds)}")
    else:
        parts.append("no deadlock")
    total = sum(tl.meals)
    parts.append(f"{total} meal{'' if total == 1 else 's'}")
    parts.append(f"{tl.rounds_played} of {tl.rounds} rounds played")
    return " · ".join(parts)


def spans(numbers: tuple[int, ...] | list[int]) -> str:
    """`1, 3-7, 9`: sorted integers with runs written as ranges."""
    out: list[str] = []
    run: list[int] = []
    for k in sorted(numbers):
        if run and k == run[-1] + 1:
            run.append(k)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
        run = [k]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)))
    return ", ".join(out)


def reward_terms(record: dict[str, Any]) -> list[tuple[str, float, float]] | None:
    """The scored reward as (term, weight with its sign, value), or None for an unscored record."""
    reward = record.get("reward")
    if not isinstance(reward, dict):
        return None
    comps, weights = reward.get("components"), reward.get("weights")
    if not isinstance(comps, dict) or not isinstance(weights, dict):
        return []
    terms = []
    for term in TERMS:
        value, w = comps.get(term.name), weights.get(term.weight)
        if isinstance(value, int | float) and isinstance(w, int | float):
            terms.append((term.name, term.sign * float(w), float(value)))
    return terms


def reward_text(record: dict[str, Any]) -> str | None:
    """`reward paper 0.862 = +1*no_deadlock(1) + ...`, or None for an unscored record."""
    terms = reward_terms(record)
    if terms is None:
        return None
    reward = record["reward"]
    total = reward.get("total")
    head = f"reward {reward.get('variant', '?')} {_num(total)}"
    if not terms:
        return head
    body = " ".join(f"{'-' if w < 0 else '+'} {_num(abs(w))}*{name}({_num(v)})" for name, w, v in terms)
    return f"{head} = {body.lstrip('+ ')}"


def _num(value: Any) -> str:
    if not isinstance(value, int | float):
        return "null"
    return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def turn_text(cell: Cell, philosopher: int, rnd: int) -> str:
    """A cell's tooltip: who, when, what was tried, what came of it."""
    where = f"P{philosopher} · round {rnd}"
    t = cell.turn
    if t is None:  # cell.missing
        return f"{where}: no turn recorded · {STATE_TEXT[cell.state]}"
    action = t.get("action")
    if action is None:
        what = "no action"
    elif t.get("ok"):
        what = action
    else:
        what = f"{action} failed ({t.get('reason')})"
    return f"{where}: {what} · {STATE_TEXT[cell.state]}"


# -- text ------------------------------------------------------------------------------------

GLYPHS = {THINKING: ".", LEFT: "L", RIGHT: "R", BOTH: "B", EATING: "E"}
LEGEND = (
    "cells  . no fork  L left fork  R right fork  B both forks  E eating\n"
    "marks  ! failed action  ? no action (null)  - no turn recorded  # deadlock"
)
_SGR = {
    THINKING: "2",
    LEFT: "36",
    RIGHT: "36",
    BOTH: "1;34",
    EATING: "1;32",
    "!": "1;31",
    "?": "1;33",
    "#": "1;31",
    "-": "2",
    "head": "1",
}


def _paint(text: str, style: str, color: bool) -> str:
    return f"\x1b[{_SGR[style]}m{text}\x1b[0m" if color and text.strip() else text


def render_text(record: dict[str, Any], color: bool = False, *, legend: bool = True, tl: Timeline | None = None) -> str:
    """The episode as rows of glyphs, one column per round; ANSI colours only when `color`."""
    tl = tl or timeline(record)
    n = tl.n
    width = max(len("deadlock"), len(f"P{n - 1}")) + 1
    played = tl.rounds_played
    lines = [
        _paint(f"episode {for_terminal(record.get('episode_id', '?'))}  {describe(record)}", "head", color),
        for_terminal(outcome_text(tl)),
        "",
    ]
    lines.append("round".ljust(width) + "".join(f"{r:>3}" for r in range(1, played + 1)))
    for i, row in enumerate(tl.cells):
        out = [f"P{i}".ljust(width)]
        for cell in row:
            mark = "?" if cell.null else "!" if cell.failed else "-" if cell.missing else " "
            out.append(" " + _paint(GLYPHS[cell.state], cell.state, color) + _paint(mark, mark, color))
        meals = tl.meals[i] if i < len(tl.meals) else 0
        out.append(f"   {meals} meal{'' if meals == 1 else 's'}")
        lines.append("".join(out))
    if tl.deadlock_rounds:
        marks = "".join("  #" if r in tl.deadlock_rounds else "   " for r in range(1, played + 1))
        lines.append(_paint("deadlock".ljust(width) + marks, "#", color))
    text = reward_text(record)
    if text:
        lines += ["", for_terminal(text)]
    if legend:
        lines += ["", LEGEND]
    return "\n".join(line.rstrip() for line in lines) + "\n"
