"""Who wins a contested fork: the conflict resolvers of `--conflict lowest-id` and `--conflict random`.

When two neighbours reach for the same free fork in a simultaneous round, the table
(`dphil.core.table`) asks its resolver; a replay asks one that reads the recorded winner.
"""

from __future__ import annotations

from collections.abc import Callable

# A conflict resolver gets (round, fork, lower_id, higher_id) and returns the winner.
Resolver = Callable[[int, int, int, int], int]


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
