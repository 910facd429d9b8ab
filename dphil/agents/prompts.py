"""What a philosopher agent reads: its system prompt and each round's observation.

Prompts are templates with `$placeholders` (string.Template: substitution
only, nothing is evaluated) so a user's `--prompt-file` is plain data. Every
prompt carries a short version hash of all the text that shapes what the model
reads, so an episode records exactly which wording it was played with and a
change of wording changes the episode id. Free of litellm: the local-model
trainer reuses this module.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from dphil.agents.tools import ACTION_DESCRIPTIONS
from dphil.core.protocols import (
    ALREADY_HELD,
    HELD_BY_NEIGHBOUR,
    LOST_CONFLICT,
    NEEDS_BOTH_FORKS,
    NO_ACTION,
    NOT_HOLDING,
    protocol_actions,
)
from dphil.core.table import Observation
from dphil.io.errors import ConfigError, NoInputError

PROMPT_VARIANTS = ("default", "minimal", "resource-ordering", "symmetry-breaking", "seat-last")

# -- fragments shared by the templates -------------------------------------------------------

RULES = {
    "paper": (
        "To eat you need both of your forks at once. Picking up a fork, eating and putting a "
        "fork down are separate actions, one per round. Eating gives you one meal and you keep "
        "holding both forks until you put them down yourself. A fork can be held by only one "
        "philosopher at a time."
    ),
    "dpbench": (
        "You eat automatically: whenever you end a round holding both of your forks you get one "
        "meal, and at the end of the following round both forks go back on the table by "
        "themselves, whatever you chose. You pick forks up one at a time; `release` puts down "
        "every fork you hold. A fork can be held by only one philosopher at a time."
    ),
}

SCHEDULE_TEXT = {
    "simultaneous": (
        "Every round all philosophers choose at the same moment, each seeing the table as it was "
        "at the start of the round. Forks put down in a round can be picked up by a neighbour in "
        "that same round; if you and a neighbour reach for the same free fork in the same round, "
        "only one of you gets it."
    ),
    "sequential": (
        "Every round the philosophers act one after another in seat order (0 first), each seeing "
        "the table as the previous one left it."
    ),
}

GOAL = (
    "The goal is shared by the whole table: every philosopher should eat, as often and as evenly "
    "as possible, and the table must never deadlock. A deadlock is the state in which every "
    "philosopher holds exactly one fork and waits for the other one, which never comes; it ends "
    "the game for everyone."
)

ANSWER_TEXT = {
    True: "Each round, answer by calling exactly one of the tools. Do not call more than one.",
    False: ("Each round, answer with one line of the form `ACTION: <name>`, where <name> is one of: $action_names."),
}

# What every seat reads alike, after the opening paragraph that names the table (and, in the
# default, the seat).
_BODY = """\
$rules

$schedule

$goal

At the start of each round you are told what you can see: the round number, which of your \
forks you hold, whether your neighbouring forks are free, your meals so far and what happened \
to your last action.

Your actions:
$actions

$answer"""

DEFAULT_TEMPLATE = (
    """\
You are philosopher $seat at a round table of $n philosophers, seated 0 to $last_seat. \
One fork lies between each pair of neighbours, $n forks in all. Your left fork is fork \
$left_fork, shared with your left neighbour, philosopher $left_neighbour. Your right fork is \
fork $right_fork, shared with your right neighbour, philosopher $right_neighbour.

"""
    + _BODY
)

# The default's wording with the seat named last: every seat's prompt at a table of n then opens
# with the same few hundred tokens, which a local model computes once for all of them (sampling's
# kept stems, training's prefix trees). Another prompt, not a faster default: a model may read it
# differently, so its episodes carry its own name and version.
SEAT_LAST_TEMPLATE = (
    """\
You are one of $n philosophers at a round table, seated 0 to $last_seat. One fork lies \
between each pair of neighbours, $n forks in all.

"""
    + _BODY
    + """

You are philosopher $seat. Your left fork is fork $left_fork, shared with your left neighbour, \
philosopher $left_neighbour. Your right fork is fork $right_fork, shared with your right \
neighbour, philosopher $right_neighbour."""
)

MINIMAL_TEMPLATE = """\
Dining philosophers. You are philosopher $seat of $n (seats 0..$last_seat). \
Left fork: fork $left_fork. Right fork: fork $right_fork.
$rules
Avoid deadlock. Let everyone eat.
Actions:
$actions
$answer"""

RESOURCE_ORDERING_STRATEGY = """

A rule that makes deadlock impossible: treat the fork numbers as a ranking and always pick up \
the lower-numbered of your two forks before the higher-numbered one; when you are done, put \
the higher-numbered one down first. For you, the lower fork is fork $lower_fork, your \
$lower_side fork: reach for your $lower_side fork first, then your $higher_side fork."""

SYMMETRY_BREAKING_STRATEGY = """

Deadlock happens when everyone reaches for the same side at once. To break that symmetry, \
philosophers in even-numbered seats reach for their left fork first and philosophers in \
odd-numbered seats reach for their right fork first. Your seat, $seat, is $parity: reach for \
your $first_side fork first, then the other one."""

BUILTIN_TEMPLATES = {
    "default": DEFAULT_TEMPLATE,
    "minimal": MINIMAL_TEMPLATE,
    "resource-ordering": DEFAULT_TEMPLATE.replace("\n\n$answer", RESOURCE_ORDERING_STRATEGY + "\n\n$answer"),
    "symmetry-breaking": DEFAULT_TEMPLATE.replace("\n\n$answer", SYMMETRY_BREAKING_STRATEGY + "\n\n$answer"),
    "seat-last": SEAT_LAST_TEMPLATE,
}

# Per-round text pieces (part of the version hash as well).
REASON_TEXT = {
    HELD_BY_NEIGHBOUR: "that fork is held by your neighbour",
    ALREADY_HELD: "you already hold that fork",
    NOT_HOLDING: "you do not hold that fork",
    NEEDS_BOTH_FORKS: "you need both of your forks to eat",
    LOST_CONFLICT: "your neighbour reached for the same fork at the same moment and got it",
    NO_ACTION: "no valid action could be read from your reply",
}
TALK_TEXT = (
    "Before you act this round you may send one short message to both of your neighbours "
    "(message $talk_round of $talk_rounds). Reply with the message text only, at most 40 words; "
    "do not choose an action yet."
)

# Every placeholder a template may use, with what it stands for (documented for --prompt-file).
PLACEHOLDERS = {
    "n": "number of philosophers",
    "seat": "this philosopher's seat (0-based)",
    "last_seat": "n - 1",
    "left_fork": "number of the left fork (= seat)",
    "right_fork": "number of the right fork ((seat + 1) mod n)",
    "left_neighbour": "seat of the left neighbour",
    "right_neighbour": "seat of the right neighbour",
    "lower_fork": "the lower-numbered of the two forks",
    "lower_side": "'left' or 'right': the side of the lower fork",
    "higher_side": "the other side",
    "parity": "'even' or 'odd' (the seat)",
    "first_side": "'left' for even seats, 'right' for odd seats",
    "rules": "the protocol's rules paragraph",
    "schedule": "how the rounds are played (simultaneous or sequential)",
    "goal": "the shared goal paragraph",
    "actions": "the actions, one per line with their descriptions",
    "action_names": "the action names, comma separated",
    "answer": "how to answer (tool call, or ACTION: line without tools)",
    "protocol": "the protocol name",
}

_FRAGMENTS = json.dumps(
    [
        RULES,
        SCHEDULE_TEXT,
        GOAL,
        ANSWER_TEXT[False],
        ANSWER_TEXT[True],
        ACTION_DESCRIPTIONS,
        REASON_TEXT,
        TALK_TEXT,
        "observation-v1",
    ],
    sort_keys=True,
)


@dataclass(frozen=True)
class Prompt:
    """A named system-prompt template with the short hash that versions its wording."""

    name: str
    template: str
    version: str

    def system(
        self,
        protocol: str,
        n: int,
        philosopher: int,
        *,
        schedule: str = "simultaneous",
        tools: bool = True,
    ) -> str:
        """The system prompt for one seat."""
        return (
            Template(self.template)
            .substitute(_values(protocol, n, philosopher, schedule=schedule, tools=tools))
            .strip()
        )


def _version(template: str) -> str:
    return hashlib.sha256((template + "\0" + _FRAGMENTS).encode()).hexdigest()[:10]


def _values(protocol: str, n: int, i: int, *, schedule: str, tools: bool) -> dict[str, Any]:
    if protocol not in RULES:
        raise ValueError(f"unknown protocol {protocol!r}")
    if schedule not in SCHEDULE_TEXT:
        raise ValueError(f"unknown schedule {schedule!r}")
    if not 0 <= i < n:
        raise ValueError(f"philosopher {i} is not at a table of {n}")
    right = (i + 1) % n
    lower_left = i < right
    names = protocol_actions(protocol)
    action_names = ", ".join(names)
    return {
        "n": n,
        "seat": i,
        "last_seat": n - 1,
        "left_fork": i,
        "right_fork": right,
        "left_neighbour": (i - 1) % n,
        "right_neighbour": right,
        "lower_fork": min(i, right),
        "lower_side": "left" if lower_left else "right",
        "higher_side": "right" if lower_left else "left",
        "parity": "even" if i % 2 == 0 else "odd",
        "first_side": "left" if i % 2 == 0 else "right",
        "rules": RULES[protocol],
        "schedule": SCHEDULE_TEXT[schedule],
        "goal": GOAL,
        "actions": "\n".join(f"- {a}: {ACTION_DESCRIPTIONS[protocol][a]}" for a in names),
        "action_names": action_names,
        "answer": Template(ANSWER_TEXT[tools]).substitute(action_names=action_names),
        "protocol": protocol,
    }


def builtin_prompt(name: str = "default") -> Prompt:
    """One of the built-in variants (PROMPT_VARIANTS)."""
    try:
        template = BUILTIN_TEMPLATES[name]
    except KeyError:
        raise ConfigError(f"unknown prompt {name!r} (expected one of {', '.join(PROMPT_VARIANTS)})") from None
    return Prompt(name, template, _version(template))


def load_prompt_file(path: str | Path) -> Prompt:
    """A user's system-prompt template: text with `$placeholders`, checked on load.

    Its name is `file:<stem>`; its version hashes the text itself, so two files
    with the same wording give the same episode ids wherever they live.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise NoInputError(f"{p}: no such prompt file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise NoInputError(f"{p}: cannot read prompt file: {e}") from None
    if not text.strip():
        raise ConfigError(f"{p}: the prompt file is empty")
    check_template(text, source=str(p))
    return Prompt(f"file:{p.stem}", text, _version(text))


def check_template(text: str, *, source: str = "prompt") -> None:
    """Raise ConfigError naming the first unknown or malformed placeholder."""
    try:
        Template(text).substitute({k: "" for k in PLACEHOLDERS})
    except KeyError as e:
        known = ", ".join(sorted(PLACEHOLDERS))
        raise ConfigError(f"{source}: unknown placeholder ${e.args[0]} (known: {known})") from None
    except ValueError as e:
        raise ConfigError(f"{source}: malformed placeholder ({e}); write $$ for a dollar sign") from None


def get_prompt(name: str = "default", file: str | Path | None = None) -> Prompt:
    """The prompt a run uses: `file` when given, else the built-in variant `name`."""
    return load_prompt_file(file) if file is not None else builtin_prompt(name)


def system_prompt(
    protocol: str,
    n: int,
    philosopher: int,
    variant: str = "default",
    *,
    schedule: str = "simultaneous",
    tools: bool = True,
) -> str:
    """The system prompt of a built-in variant for one seat."""
    return builtin_prompt(variant).system(protocol, n, philosopher, schedule=schedule, tools=tools)


# -- each round -----------------------------------------------------------------------------


def observation_text(obs: Observation, extras: dict[str, Any] | None = None, *, tools: bool = True) -> str:
    """The short text an agent reads at the start of a round.

    `extras` may carry `messages`: a list of `{"from": seat, "text": str}` from
    the neighbours, shown in the order they were written; and `talk`: a pair
    (k, K) that makes it end with the request for message k of K instead of the
    request for an action.
    """
    i, n = obs.philosopher, obs.n
    lines = [f"Round {obs.round} of {obs.rounds}."]
    lines.append(_fork_line("left", i, (i - 1) % n, obs.holds_left, obs.left_free))
    lines.append(_fork_line("right", (i + 1) % n, (i + 1) % n, obs.holds_right, obs.right_free))
    lines.append(f"Meals so far: {obs.meals}.")
    if obs.eating:
        lines.append("You are eating: both of your forks go back on the table at the end of this round.")
    if obs.last_action is None:
        if obs.last_ok is None:
            lines.append("You have not acted yet.")
        else:
            lines.append(f"Last round: {REASON_TEXT[NO_ACTION]}, so nothing happened.")
    elif obs.last_ok:
        lines.append(f"Your last action, {obs.last_action}, worked.")
    else:
        why = REASON_TEXT.get(obs.last_reason or "", obs.last_reason or "it had no effect")
        lines.append(f"Your last action, {obs.last_action}, failed: {why}.")
    extras = extras or {}
    lines.extend(_message_lines(i, n, extras.get("messages") or []))
    lines.append(_closing(tools, extras.get("talk")))
    return "\n".join(lines)


def followup_text(
    philosopher: int,
    n: int,
    messages: list[dict[str, Any]],
    *,
    tools: bool = True,
    talk: tuple[int, int] | None = None,
) -> str:
    """A later prompt of the same round (after a talk step): new messages, then the request."""
    lines = _message_lines(philosopher, n, messages)
    if not lines:
        lines.append("No new messages from your neighbours.")
    lines.append(_closing(tools, talk))
    return "\n".join(lines)


def _message_lines(i: int, n: int, messages: list[dict[str, Any]]) -> list[str]:
    if not messages:
        return []
    lines = ["Messages from your neighbours, in the order they were written:"]
    for m in messages:
        lines.append(
            f"- philosopher {m['from']} ({_side_of(i, m['from'], n)}): {json.dumps(m['text'], ensure_ascii=False)}"
        )
    return lines


def _closing(tools: bool, talk: tuple[int, int] | None) -> str:
    if talk is not None:
        return talk_text(*talk)
    if tools:
        return "Choose your action: call one tool."
    return "Choose your action: answer `ACTION: <name>`."


def _fork_line(side: str, fork: int, neighbour: int, held: bool, free: bool) -> str:
    if held:
        state = "you hold it"
    elif free:
        state = "free"
    else:
        state = f"held by your {side} neighbour (philosopher {neighbour})"
    return f"Your {side} fork (fork {fork}): {state}."


def _side_of(i: int, other: int, n: int) -> str:
    left, right = (i - 1) % n, (i + 1) % n
    if other == left and other == right:
        return "left and right neighbour"
    if other == left:
        return "left neighbour"
    if other == right:
        return "right neighbour"
    return "not a neighbour"


def talk_text(talk_round: int, talk_rounds: int) -> str:
    """The request for one neighbour message before acting (`--talk K`)."""
    return Template(TALK_TEXT).substitute(talk_round=talk_round, talk_rounds=talk_rounds)
