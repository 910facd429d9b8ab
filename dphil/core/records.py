"""The record contract: field names, ids and the checks every reader applies.

Other commands, users' `jq` scripts and polars queries depend on these names,
so they are defined once here. `schemas/*.schema.json` describes the same
contract for outside tools; the tests validate `samples/` against them.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson

from dphil import __version__
from dphil.core.protocols import CONFLICTS, DEADLOCK_MODES, PROTOCOLS, SCHEDULES
from dphil.core.table import Table
from dphil.io.errors import DataError

# 2: local models' turns keep their reply as `raw`, like API turns (1 called it `reply`).
SCHEMA_VERSION = 2

# -- what every reader accepts (dphil-score, dphil-stats, dphil-show): one definition -------

# The versions this dphil reads: `turn_raw` reads version 1's `reply`; anything else (99, "2",
# null) was written by something else and is refused. A record without the field (written by
# hand) is read as the current version.
SCHEMA_VERSIONS = (1, SCHEMA_VERSION)
# A seed is a JSON integer as orjson reads and writes one: int64 or uint64. (2**64 parses as a
# float, and so is refused as not an integer.)
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1
# The largest magnitude of a reward total (and of the other real numbers dphil-stats sums:
# metrics, cost). Under the study's weights a total lies within a few units (the fairness
# penalty grows with rounds**2); beyond 1e100 it can only come from absurd weights or a
# hostile file. Squares of such numbers summed over 10**100 episodes stay finite, so no mean
# or variance in dphil-stats overflows to inf.
MAX_MAGNITUDE = 1e100


@dataclass(frozen=True)
class EpisodeConfig:
    """Everything that determines an episode, and so its id.

    `variant` holds run settings beyond the table (prompt, memory, adapter,
    checkpoint, ...) that change what is measured and therefore the id; they
    are also written into the record as top-level fields.
    """

    model: str
    n: int
    rounds: int = 5
    seed: int = 0
    protocol: str = "paper"
    schedule: str = "simultaneous"
    conflict: str = "random"
    deadlock_mode: str = "terminal"
    variant: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("protocol", self.protocol, PROTOCOLS),
            ("schedule", self.schedule, SCHEDULES),
            ("conflict", self.conflict, CONFLICTS),
            ("deadlock_mode", self.deadlock_mode, DEADLOCK_MODES),
        ):
            if value not in allowed:
                raise ValueError(f"unknown {name} {value!r} (expected one of {', '.join(allowed)})")
        if self.n < 2:
            raise ValueError(f"n must be at least 2, got {self.n}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be at least 1, got {self.rounds}")

    def with_seed(self, seed: int) -> EpisodeConfig:
        """The same configuration with another seed, without re-validating (grids make millions).

        The clones share this configuration's identity bytes, so `variant` must
        not change once a clone is made (the configuration is frozen; so is its
        variant in spirit).
        """
        mine = self.__dict__
        if "_id_around_seed" not in mine:  # built once here, shared by every clone
            mine["_id_around_seed"] = _around_seed(self.identity(), self.variant)
        clone = object.__new__(EpisodeConfig)
        state = clone.__dict__
        state.update(mine)
        state["seed"] = seed
        state.pop("_episode_id", None)
        return clone

    @property
    def episode_id(self) -> str:
        """This configuration's episode id, computed once.

        Grids make one configuration per seed (`with_seed`), so the canonical
        bytes of the identity around the seed are built once per cell and each
        seed only hashes them with its digits: the same bytes `episode_id()`
        hashes, for a fraction of the work.
        """
        state = self.__dict__
        try:
            return state["_episode_id"]
        except KeyError:
            pass
        around = state.get("_id_around_seed")
        if around is None:
            around = state["_id_around_seed"] = _around_seed(self.identity(), self.variant)
        seed = self.seed
        if around and type(seed) is int and SEED_MIN <= seed <= SEED_MAX:
            value = hashlib.blake2b(b"%b%d%b" % (around[0], seed, around[1]), digest_size=8).hexdigest()
        else:
            value = episode_id(self.identity())
        state["_episode_id"] = value
        return value

    def identity(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "n": self.n,
            "rounds": self.rounds,
            "seed": self.seed,
            "protocol": self.protocol,
            "schedule": self.schedule,
            "conflict": self.conflict,
            "deadlock_mode": self.deadlock_mode,
            **self.variant,
        }

    def header(self) -> dict[str, Any]:
        """The leading fields of the record, in contract order."""
        return {
            "kind": "episode",
            "schema_version": SCHEMA_VERSION,
            "episode_id": self.episode_id,
            "model": self.model,
            "n": self.n,
            "rounds": self.rounds,
            "seed": self.seed,
            "protocol": self.protocol,
            "schedule": self.schedule,
            "conflict": self.conflict,
            "deadlock_mode": self.deadlock_mode,
            **self.variant,
        }


def turn_raw(turn: dict[str, Any]) -> str | None:
    """A model turn's raw reply: `raw`, or `reply` in schema-1 records of local models."""
    raw = turn.get("raw")
    return turn.get("reply") if raw is None else raw


def episode_id(identity: dict[str, Any]) -> str:
    """A stable 16-hex-digit id: a hash of the identity fields, independent of key order."""
    return hashlib.blake2b(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS), digest_size=8).hexdigest()


def _around_seed(identity: dict[str, Any], variant: dict[str, Any]) -> tuple[bytes, bytes] | tuple[()]:
    """The canonical identity bytes before and after the seed's digits; () when they cannot be told apart."""
    if "seed" in variant:
        return ()
    data = orjson.dumps({**identity, "seed": 0}, option=orjson.OPT_SORT_KEYS)
    marker = b'"seed":0'
    if data.count(marker) != 1:  # a nested "seed" in a variant value: hash the whole identity each time
        return ()
    cut = data.index(marker) + len(marker) - 1
    return data[:cut], data[cut + 1 :]


def episode_record(
    config: EpisodeConfig,
    table: Table,
    *,
    status: str = "complete",
    error: str | None = None,
) -> dict[str, Any]:
    """Build the episode record for a finished (or failed) table."""
    record = config.header()
    record["status"] = status
    if error is not None:
        record["error"] = error
    dl = table.deadlock_rounds
    record["turns"] = table.turns
    record["events"] = table.events
    record["meals"] = table.meals
    record["deadlock"] = bool(dl)
    record["deadlock_round"] = dl[0] if dl else None
    record["deadlock_rounds"] = dl
    record["rounds_played"] = table.round
    record["dphil_version"] = __version__
    return record


# -- checks applied by readers --------------------------------------------------------

_EPISODE_TYPES: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("n", int),
    ("rounds", int),
    ("seed", int),
    ("protocol", str),
    ("schedule", str),
    ("status", str),
    ("turns", list),
    ("meals", list),
)


_STATUSES = ("complete", "error")


def check_episode(record: dict[str, Any]) -> None:
    """Raise DataError naming the first missing or ill-typed field of an episode record."""
    try:  # the common case, checked in one expression; anything off falls through to say what
        if (
            record.get("kind", "episode") == "episode"
            and type(record["n"]) is int
            and type(record["rounds"]) is int
            and type(record["seed"]) is int
            and SEED_MIN <= record["seed"] <= SEED_MAX
            and type(record.get("schema_version", SCHEMA_VERSION)) is int
            and record.get("schema_version", SCHEMA_VERSION) in _VERSIONS
            and type(record["turns"]) is list
            and type(record["meals"]) is list
            and record["status"] in _STATUSES
            and record["protocol"] in PROTOCOLS
            and record["schedule"] in SCHEDULES
            and record["n"] >= 2
            and record["rounds"] >= 1
        ):
            return
    except (KeyError, TypeError):
        pass
    kind = record.get("kind", "episode")
    if kind != "episode":
        raise DataError(f"expected an episode record, got kind {kind!r}")
    check_schema_version(record)
    for name, typ in _EPISODE_TYPES:
        if name not in record:
            raise DataError(f"missing field {name!r}")
        value = record[name]
        if name == "seed":
            check_seed(value)
        elif not isinstance(value, typ) or isinstance(value, bool):
            raise DataError(f"field {name!r} should be {_type_name(typ)}, got {_type_name(type(value))}")
    if record["status"] not in ("complete", "error"):
        raise DataError(f"field 'status' should be 'complete' or 'error', got {record['status']!r}")
    if record["protocol"] not in PROTOCOLS:
        raise DataError(f"unknown protocol {record['protocol']!r}")
    if record["schedule"] not in SCHEDULES:
        raise DataError(f"unknown schedule {record['schedule']!r}")
    if record["n"] < 2 or record["rounds"] < 1:
        raise DataError("field 'n' must be at least 2 and 'rounds' at least 1")


_VERSIONS = frozenset(SCHEMA_VERSIONS)


def check_schema_version(record: dict[str, Any]) -> None:
    """DataError unless the record's `schema_version` is one this dphil reads (or absent)."""
    if "schema_version" not in record:
        return
    version = record["schema_version"]
    if type(version) is not int or version not in _VERSIONS:
        known = " and ".join(map(str, SCHEMA_VERSIONS))
        raise DataError(
            f"unknown schema_version {_shown(version)}: this dphil reads versions {known} "
            "(a newer dphil, or another tool, wrote this record)"
        )


def check_seed(seed: Any) -> int:
    """The seed, or DataError unless it is an integer orjson can write (int64 or uint64)."""
    if not is_int(seed) or not SEED_MIN <= seed <= SEED_MAX:
        # 2**64 in a file parses as a float: it is refused here as not an integer.
        raise DataError(f"field 'seed' should be an integer from -2**63 to 2**64-1, got {_shown(seed)}")
    return seed


def check_number(value: Any, name: str) -> float:
    """A finite JSON number no larger in magnitude than MAX_MAGNITUDE, or DataError naming `name`."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise DataError(f"field {name!r} should be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise DataError(f"field {name!r} should be a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise DataError(f"field {name!r} is out of range: {_shown(value)} is beyond ±{MAX_MAGNITUDE:g}")
    return float(value)


def _shown(value: Any) -> str:
    """A value from a record as JSON, cut to 40 characters (it may be anything, of any size)."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # not JSON: an int beyond 64 bits, say (records built in Python)
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def is_int(value: Any) -> TypeGuard[int]:
    """A JSON integer as parsed: an int that is not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


def checked_outcome(record: dict[str, Any]) -> tuple[list[int], bool]:
    """An episode's recorded `meals` and `deadlock`, or a DataError naming the one that is malformed."""
    deadlock = record.get("deadlock")
    if not isinstance(deadlock, bool):
        raise DataError("field 'deadlock' should be true or false")
    meals = record.get("meals")
    if not isinstance(meals, list) or not all(is_int(m) for m in meals):
        raise DataError("field 'meals' should be a list of integers")
    return meals, deadlock


def _type_name(typ: type | tuple[type, ...]) -> str:
    names = {
        int: "an integer",
        str: "a string",
        list: "a list",
        dict: "an object",
        bool: "a boolean",
        float: "a number",
        type(None): "null",
    }
    if isinstance(typ, tuple):
        return " or ".join(names.get(t, t.__name__) for t in typ)
    return names.get(typ, typ.__name__)
