"""Engine invariants under arbitrary actions (hypothesis)."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from dphil.core.conflicts import random_resolver
from dphil.core.episode import play, replay
from dphil.core.policies import POLICIES
from dphil.core.protocols import protocol_actions
from dphil.core.records import EpisodeConfig, episode_record
from dphil.core.table import FREE, Table
from dphil.io.errors import DataError

settings.register_profile("dphil", max_examples=150, deadline=None)
settings.load_profile("dphil")

configs = st.fixed_dictionaries(
    {
        "n": st.integers(2, 8),
        "rounds": st.integers(1, 6),
        "protocol": st.sampled_from(["paper", "dpbench"]),
        "schedule": st.sampled_from(["simultaneous", "sequential"]),
        "conflict": st.sampled_from(["random", "lowest-id"]),
        "deadlock_mode": st.sampled_from(["terminal", "continue"]),
        "seed": st.integers(0, 2**32),
    }
)


@st.composite
def random_episodes(draw):
    """A config plus an arbitrary action (or null) for every philosopher and round."""
    cfg = draw(configs)
    actions = [*protocol_actions(cfg["protocol"]), None]
    script = draw(
        st.lists(
            st.lists(st.sampled_from(actions), min_size=cfg["n"], max_size=cfg["n"]),
            min_size=cfg["rounds"],
            max_size=cfg["rounds"],
        )
    )
    return cfg, script


def run_script(cfg, script) -> tuple[Table, list[list[int]]]:
    """Play the scripted actions, checking invariants after every step."""
    from dphil.core.conflicts import lowest_id

    resolve = lowest_id if cfg["conflict"] == "lowest-id" else random_resolver(cfg["seed"])
    t = Table(cfg["n"], cfg["rounds"], protocol=cfg["protocol"], deadlock_mode=cfg["deadlock_mode"], resolve=resolve)
    n = cfg["n"]
    for actions in script:
        if t.over:
            break
        before_meals = list(t.meals)
        r = t.round
        if cfg["schedule"] == "simultaneous":
            t.play_simultaneous(actions)
        else:
            for i, a in enumerate(actions):
                t.act(i, a)
                check_forks(t)
            t.end_round()
        check_forks(t)
        for i in range(n):
            # meals only ever grow, by at most one per round, and only for someone who
            # held both forks at some point this round (checked via the turns/events)
            assert t.meals[i] - before_meals[i] in (0, 1)
            if t.meals[i] > before_meals[i]:
                ate = any(
                    x["philosopher"] == i and x["action"] == "eat" and x["ok"] for x in t.turns if x["round"] == r
                )
                auto = any(e["philosopher"] == i and e["event"] == "auto-eat" for e in t.events if e["round"] == r)
                assert ate or auto
    return t


def check_forks(t: Table) -> None:
    n = t.n
    for f, h in enumerate(t.holder):
        # a fork has at most one holder, and only one of the two philosophers beside it
        assert h in (FREE, f, (f - 1) % n)


@given(random_episodes())
def test_invariants_hold_for_any_actions(case):
    cfg, script = case
    t = run_script(cfg, script)
    # every round played has exactly one turn per philosopher
    assert len(t.turns) == cfg["n"] * t.rounds_played
    # deadlock rounds are exactly the rounds that ended with everyone holding one fork
    if cfg["deadlock_mode"] == "terminal" and t.deadlock_rounds:
        assert t.deadlock_rounds == [t.rounds_played]


@given(random_episodes())
def test_replay_reproduces_the_outcome(case):
    cfg, script = case
    t = run_script(cfg, script)
    config = EpisodeConfig(model="test", **cfg)
    record = copy.deepcopy(episode_record(config, t))
    out = replay(record)
    assert list(out.meals) == record["meals"]
    assert out.deadlock == record["deadlock"]
    assert out.deadlock_round == record["deadlock_round"]
    assert out.rounds_played == record["rounds_played"]


@given(random_episodes(), st.data())
def test_replay_rejects_a_tampered_turn(case, data):
    cfg, script = case
    t = run_script(cfg, script)
    record = copy.deepcopy(episode_record(EpisodeConfig(model="test", **cfg), t))
    k = data.draw(st.integers(0, len(record["turns"]) - 1))
    record["turns"][k]["ok"] = not record["turns"][k]["ok"]
    try:
        replay(record)
    except DataError:
        return
    raise AssertionError("a flipped outcome was accepted")


@given(configs, st.sampled_from(sorted(POLICIES)))
def test_seeds_reproduce_episodes(cfg, policy_name):
    config = EpisodeConfig(model=f"scripted:{policy_name}", **cfg)
    first = play(config, POLICIES[policy_name])
    second = play(config, POLICIES[policy_name])
    assert first == second
    assert first["episode_id"] == EpisodeConfig(model=f"scripted:{policy_name}", **cfg).episode_id


def settle_by_apply_code(t: Table, actions) -> list[tuple]:
    """The simultaneous round rules spelled out with `apply_code`, one philosopher at a time.

    The engine writes these rules out inline for speed; this is the slow, plain
    statement they must agree with: releases in id order, then pick-ups (a fork
    both neighbours reach for while it lies free goes to the resolver's winner),
    then eating, thinking and no-ops.
    """
    from dphil.core.protocols import O_LOST_CONFLICT, OK, PICK_LEFT, PICK_RIGHT, PUT_ALL, REASONS

    codes = [t.code(a) for a in actions]
    n = t.n
    out: list[tuple] = []

    def record(i, o):
        out.append((t.round, i, actions[i], o == OK, None if o == OK else REASONS[o - 1]))

    for i in range(n):
        if PICK_RIGHT < codes[i] <= PUT_ALL:
            record(i, t.apply_code(i, codes[i]))
    picks = [i for i in range(n) if codes[i] <= PICK_RIGHT]
    losers = set()
    for i in picks:
        f = (i + 1) % n
        if codes[i] == PICK_RIGHT and codes[f] == PICK_LEFT and t.holder[f] == FREE:
            a, b = min(i, f), max(i, f)
            losers.add(b if t._resolve(t.round, f, a, b) == a else a)
    for i in picks:
        record(i, O_LOST_CONFLICT if i in losers else t.apply_code(i, codes[i]))
    for i in range(n):
        if codes[i] > PUT_ALL:
            record(i, t.apply_code(i, codes[i]))
    return out


@given(random_episodes(), st.data())
def test_simultaneous_rounds_follow_apply_code(case, data):
    cfg, script = case
    n = cfg["n"]
    holders = data.draw(st.lists(st.sampled_from(["free", "left", "right"]), min_size=n, max_size=n))
    tables = []
    for _ in range(2):
        t = Table(n, cfg["rounds"], protocol=cfg["protocol"], resolve=random_resolver(cfg["seed"]))
        for f, h in enumerate(holders):  # fork f starts free, with its left-hand user f, or right-hand f-1
            t.holder[f] = {"free": FREE, "left": f, "right": (f - 1) % n}[h]
        t.eating = [bool(i % 2) for i in range(n)]
        tables.append(t)
    engine, plain = tables
    for actions in script:
        got = [(x["round"], x["philosopher"], x["action"], x["ok"], x["reason"]) for x in engine.resolve_round(actions)]
        assert got == settle_by_apply_code(plain, actions)
        assert (engine.holder, engine.meals, engine.eating) == (plain.holder, plain.meals, plain.eating)
        engine.end_round()
        plain.end_round()
        if engine.over:
            break


@given(random_episodes())
def test_recorded_turns_are_the_records_own(case):
    """Turn dicts are built once per distinct turn; what an episode records must still be its own."""
    cfg, script = case
    first = run_script(cfg, script)
    for turn in first.turns:
        turn["ok"] = "tampered"
        turn["extra"] = 1
    second = run_script(cfg, script)
    assert all(turn["ok"] in (True, False) and "extra" not in turn for turn in second.turns)
    replayed = Table(cfg["n"], cfg["rounds"], protocol=cfg["protocol"]).resolve_round(script[0])
    assert all("extra" not in turn for turn in replayed)


@given(configs, st.sampled_from(sorted(POLICIES)))
def test_play_line_is_the_record_play_returns(cfg, policy_name):
    """dphil-rollout's path (shared turn dicts, serialised at once) writes exactly `play`'s record."""
    from dphil.core.episode import play_line
    from dphil.io.jsonl import dumps

    config = EpisodeConfig(model=f"scripted:{policy_name}", **cfg)
    line = play_line(config, POLICIES[policy_name])
    record = play(config, POLICIES[policy_name])
    assert line == dumps(record)
    record["turns"][0]["ok"] = "tampered"  # play's record is the caller's to change ...
    assert play_line(config, POLICIES[policy_name]) == line  # ... and nothing shared changes with it


@given(
    configs,
    st.dictionaries(
        st.sampled_from(["prompt", "seed", "adapter", "x"]),
        st.one_of(
            st.text(max_size=12),
            st.integers(-3, 3),
            st.dictionaries(st.sampled_from(["seed", "y"]), st.integers(-1, 1)),
        ),
        max_size=3,
    ),
    st.integers(-(1 << 63), (1 << 64) - 1),
)
def test_episode_ids_of_clones_hash_the_whole_identity(cfg, variant, seed):
    """The per-cell shortcut in EpisodeConfig.episode_id gives exactly the documented hash."""
    from dphil.core.records import episode_id

    cell = EpisodeConfig(model="scripted:random", **{**cfg, "seed": 0}, variant=variant)
    clone = cell.with_seed(seed)
    assert clone.episode_id == episode_id(clone.identity())
    assert cell.episode_id == episode_id(cell.identity())


def test_big_tables_and_late_rounds_build_turns_afresh():
    """Turn dicts are kept only for small tables' early rounds; past that the engine builds them, alike."""
    from dphil.core import turn_cache
    from dphil.core.episode import play_line
    from dphil.io.jsonl import dumps

    for n, rounds in ((turn_cache._CACHED_N + 6, 3), (5, turn_cache._CACHED_ROUNDS + 6)):
        config = EpisodeConfig(model="scripted:random", n=n, rounds=rounds, deadlock_mode="continue", seed=n)
        assert play_line(config, POLICIES["random"]) == dumps(play(config, POLICIES["random"]))
    for by_round in turn_cache._SLOTS.values():
        assert len(by_round) == turn_cache._CACHED_ROUNDS + 1
        assert all(slots is None or len(slots) <= turn_cache._CACHED_N for slots in by_round)


def test_threads_playing_at_once_write_the_same_records():
    from concurrent.futures import ThreadPoolExecutor

    from dphil.core.episode import play_line
    from dphil.io.jsonl import dumps

    configs = [
        EpisodeConfig(model="scripted:random", n=n, rounds=r, deadlock_mode="continue", seed=s)
        for s, (n, r) in enumerate([(5, 80), (70, 4), (3, 20)] * 8)
    ]
    with ThreadPoolExecutor(8) as pool:
        lines = list(pool.map(lambda c: play_line(c, POLICIES["random"]), configs))
    assert lines == [dumps(play(c, POLICIES["random"])) for c in configs]
