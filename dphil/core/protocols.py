"""The table's vocabulary: each protocol's actions and opcodes, the other rule settings, why a turn fails.

Two protocols share one engine (`dphil.core.table`) by mapping every action name to an
internal opcode: `paper` (the study's six tools) and `dpbench` (DPBench's four actions
with automatic eating and releasing). Prompts, tools, parsers, records and the commands
need these names without the engine itself.
"""

from __future__ import annotations

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
# A turn's outcome as a small int: OK, or 1 + the index of its reason in REASONS.
OK = 0
O_HELD_BY_NEIGHBOUR, O_ALREADY_HELD, O_NOT_HOLDING, O_NEEDS_BOTH_FORKS, O_LOST_CONFLICT, O_NO_ACTION = range(1, 7)
_REASON_OF: tuple[str | None, ...] = (None, *REASONS)


_ACTIONS = {name: tuple(codes) for name, codes in PROTOCOLS.items()}
# Each protocol's opcodes with "no action" (None) included, so a round maps in one C call.
_OPCODES: dict[str, dict[str | None, int]] = {name: codes | {None: NOOP} for name, codes in PROTOCOLS.items()}


def protocol_actions(protocol: str) -> tuple[str, ...]:
    """The action names a protocol offers, in their canonical order."""
    return _ACTIONS[protocol]


# Each protocol's explicit do-nothing action: the idle term of the reward counts it.
IDLE_ACTIONS = {"paper": "think", "dpbench": "wait"}
