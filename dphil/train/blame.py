"""Who is to blame for a deadlock: every holder in the cycle, by how long it held and waited.

A deadlock at this table is a cycle through the whole table: every philosopher holds
exactly one fork and waits for the other (all left forks or all right ones). Blaming
only whoever completed the cycle rewards grabbing a fork early and sitting on it, the
behaviour that makes the cycle possible (docs/recipes.md); so each holder is blamed in
proportion to its hold-and-wait time, Coffman's condition measured in rounds.
"""

from __future__ import annotations

from collections.abc import Sequence

# Recorded with the modes that use it (`AdvantageSpec.as_record`): a run resumed under another
# rule is refused. Records without it were trained when only the cycle's completer was blamed.
BLAME_RULE = "hold-and-wait"


def hold_wait_rounds(holders_by_round: Sequence[Sequence[int]], deadlock_round: int) -> list[int]:
    """Per seat: the unbroken run of rounds, ending with the deadlock round, at whose end it held
    the fork it holds in the deadlock and not its other fork.

    `holders_by_round[r - 1][f]` is the holder of fork f at the end of round r (-1 free);
    philosopher i's forks are i (left) and (i + 1) mod N (right). Every seat in the cycle
    counts the deadlock round itself, so each run is at least 1.
    """
    at = deadlock_round - 1
    final = holders_by_round[at]
    n = len(final)
    out = []
    for i in range(n):
        mine = [f for f in (i, (i + 1) % n) if final[f] == i]
        if len(mine) != 1:  # not holding-and-waiting at the deadlock (not a deadlock pattern)
            out.append(0)
            continue
        f = mine[0]
        other = (i + 1) % n if f == i else i
        run = 0
        for r in range(at, -1, -1):
            h = holders_by_round[r]
            if h[f] != i or h[other] == i:
                break
            run += 1
        out.append(run)
    return out


def deadlock_blame(holders_by_round: Sequence[Sequence[int]], deadlock_round: int) -> list[float]:
    """Each seat's share of the blame for the deadlock (the shares sum to 1).

    b_i = h_i / sum_j h_j with h_i the seat's `hold_wait_rounds`; equal shares if
    nobody held and waited (a record whose last round is not a deadlock pattern).
    """
    runs = hold_wait_rounds(holders_by_round, deadlock_round)
    total = sum(runs)
    if not total:
        return [1.0 / len(runs)] * len(runs)
    return [h / total for h in runs]
