"""Kept conversations: a round's candidates scored from each conversation's cache equal the whole-prompt scores.

Conversations grow round by round as `--memory full` grows them; two of them start from the
same prompt and then diverge (a group's episodes share their scenario), so a kept cache that
two prompts extend must not be extended in place. Held to `candidate_logprobs` (itself held to
the plain full-logit computation in test_logprobs.py). Gemma 3's sliding-window layers are
not cached: its model says so and samples from prefix-tree rows instead.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.support.logprobs import LOGPROB_TOLERANCE

ACTIONS = ("eat", "think", "pick-up-left", "put-down-right")


def play_rounds(lm, cache, rounds=4):
    """Score every round's candidates both ways; return the largest difference."""
    torch = lm.torch
    cands = lm.candidate_ids(ACTIONS)
    seats = [0, 0, 1]  # the first two conversations are the same seat of the same scenario
    convs = [[{"role": "system", "content": "Five philosophers share five forks."}] for _ in seats]
    worst = 0.0
    for r in range(rounds):
        prompts = []
        for c, seat in enumerate(seats):
            convs[c].append({"role": "user", "content": f"You are philosopher {seat}. Round {r + 1}."})
            prompts.append(lm.prompt_ids(convs[c]))
        got = cache.candidate_logprobs(prompts, cands, temperature=0.8)
        with torch.no_grad():
            whole = lm.candidate_logprobs(prompts, cands, temperature=0.8)
        assert torch.allclose(got, whole, **LOGPROB_TOLERANCE), (r, got, whole)
        worst = max(worst, float((got - whole).abs().max()))
        for c in range(len(seats)):  # the first two diverge from round 1 on
            convs[c].append({"role": "assistant", "content": f"ACTION: {ACTIONS[(c + r) % 4]}"})
    return worst


def test_kept_conversations_score_as_whole_prompts(lm):
    from dphil.local.prefix_cache import PrefixCache

    if not PrefixCache.supports(lm.model.config):
        assert lm.model.config.model_type.startswith("gemma3")
        pytest.skip("sliding-window layers are not cached")
    cache = PrefixCache(lm)
    play_rounds(lm, cache)
    # Every later prompt extends a kept one: most positions come from the caches.
    assert cache.reused > cache.computed / 2


def test_a_small_budget_keeps_fewer_and_changes_nothing(lm):
    from dphil.local.prefix_cache import PrefixCache

    if not PrefixCache.supports(lm.model.config):
        pytest.skip("sliding-window layers are not cached")
    cache = PrefixCache(lm, budget=1)
    play_rounds(lm, cache, rounds=3)
    assert len(cache.entries) == 1 and cache.reused < cache.computed
    cache.clear()
    assert not cache.entries


def test_sampling_keeps_conversations_only_where_the_masks_allow(lm):
    from dphil.local.prefix_cache import PrefixCache

    sliding = "sliding_attention" in (getattr(lm.model.config, "layer_types", None) or [])
    assert (lm.prompt_cache is None) == sliding
    assert PrefixCache.supports(lm.model.config) == (not sliding)


def test_equal_prompts_are_scored_once_and_a_kept_one_up_to_its_last_token(lm):
    """A group's episodes start from equal prompts: one call scores them once, a later call reuses them."""
    from dphil.local.prefix_cache import PrefixCache

    if not PrefixCache.supports(lm.model.config):
        pytest.skip("sliding-window layers are not cached")
    torch = lm.torch
    from dphil.local.candidate_terms import CandidateTrie

    cands = lm.candidate_ids(ACTIONS)
    m = len(CandidateTrie.of(cands).tokens)  # the candidates as a trie, their last tokens only targets
    assert m < sum(len(c) for c in cands) - len(cands)
    prompt = lm.prompt_ids([{"role": "user", "content": "You are philosopher 2. Round 1."}])
    cache = PrefixCache(lm)
    got = cache.candidate_logprobs([prompt, prompt], cands, temperature=0.8)
    assert (cache.reused, cache.computed) == (0, len(prompt) + m)
    again = cache.candidate_logprobs([prompt], cands, temperature=0.8)
    assert (cache.reused, cache.computed) == (len(prompt) - 1, len(prompt) + m + 1 + m)
    with torch.no_grad():
        whole = lm.candidate_logprobs([prompt], cands, temperature=0.8)
    assert torch.allclose(got, whole.expand(2, -1), **LOGPROB_TOLERANCE)
    assert torch.allclose(again, whole, **LOGPROB_TOLERANCE)
    # One batch holding a conversation that extends a kept one and one that starts afresh.
    first = {"role": "user", "content": "You are philosopher 2. Round 1."}
    longer = lm.prompt_ids([first, {"role": "assistant", "content": "ACTION: eat"}])
    fresh = lm.prompt_ids([{"role": "user", "content": "You are philosopher 4. Round 1, and the table is full."}])
    reused = cache.reused
    mixed = cache.candidate_logprobs([longer, fresh], cands, temperature=0.8)
    assert cache.reused == reused + len(prompt)  # the first row from its kept cache, the second none
    with torch.no_grad():
        whole = lm.candidate_logprobs([longer, fresh], cands, temperature=0.8)
    assert torch.allclose(mixed, whole, **LOGPROB_TOLERANCE)


def test_prompts_that_open_alike_share_one_kept_stem(lm):
    """Every seat's first prompt under --prompt seat-last: the shared opening computed once, the scores unchanged."""
    from dphil.agents.prompts import system_prompt
    from dphil.local.candidate_terms import CandidateTrie
    from dphil.local.prefix_cache import PrefixCache, _common

    if not PrefixCache.supports(lm.model.config):
        pytest.skip("sliding-window layers are not cached")
    torch = lm.torch
    cands = lm.candidate_ids(ACTIONS)
    m = len(CandidateTrie.of(cands).tokens)
    prompts = [
        lm.prompt_ids(
            [
                {"role": "system", "content": system_prompt("paper", 5, seat, "seat-last", tools=False)},
                {"role": "user", "content": "Round 1 of 5."},
            ]
        )
        for seat in range(5)
    ]
    shared = min(_common(tuple(prompts[0]), tuple(p)) for p in prompts[1:])
    cache = PrefixCache(lm)
    assert shared > cache.call_positions + 20
    got = cache.candidate_logprobs(prompts, cands, temperature=0.8)
    with torch.no_grad():
        whole = lm.candidate_logprobs(prompts, cands, temperature=0.8)
    assert torch.allclose(got, whole, **LOGPROB_TOLERANCE)
    # the opening once, then each prompt's own tokens and candidates
    assert cache.computed == shared + sum(len(p) - shared + m for p in prompts)
    assert cache.reused == 5 * shared and tuple(prompts[0][:shared]) in cache.entries


def test_a_stem_is_kept_only_where_it_saves_more_than_a_call():
    from types import SimpleNamespace

    from dphil.local.prefix_cache import PrefixCache

    kept: dict[tuple[int, ...], int] = {}
    cache = SimpleNamespace(
        call_positions=32,
        _start=lambda ids: (max((len(k) for k in kept if tuple(ids[: len(k)]) == k), default=0), None),
    )
    stem = tuple(range(100))
    a, b, c = (*stem, 7, 7), (*stem, 8), (*stem[:60], 9)
    lone = (500,) * 80
    assert PrefixCache._stems(cache, [lone, b, a]) == [stem]  # lone shares nothing
    assert PrefixCache._stems(cache, [a, b, c]) == [stem[:60]]  # a run's stem: what all of it shares
    assert PrefixCache._stems(cache, [(*stem[:30], 1), (*stem[:30], 2)]) == []  # 30 positions: not worth a call
    kept[stem[:90]] = 1  # all but 10 of it already kept: not worth a call either
    assert PrefixCache._stems(cache, [a, b]) == []


def test_a_round_is_batched_by_new_tokens_with_little_padding():
    from dphil.local.prefix_cache import _batches

    # 1 and 30 pad 29 positions (within CALL_POSITIONS = 32); 40 would pad 2 x 40 - 31 = 49 more;
    # equal counts pad nothing, however many.
    new = {(1,): 1, (2,): 30, (3,): 40, (4,): 112, (5,): 500, (6,): 40, (7,): 40, (8,): 41, (9,): 60}
    assert _batches(list(new), new) == [[(1,), (2,)], [(3,), (6,), (7,), (8,)], [(9,)], [(4,)], [(5,)]]


def test_a_call_costs_more_positions_with_amx_tiles():
    """AMX repacks every weight per call: batches may pad more before another call is cheaper."""
    from types import SimpleNamespace

    from dphil.local.prefix_cache import AMX_CALL_POSITIONS, CALL_POSITIONS, _batches, call_positions

    amx = SimpleNamespace(cpu=SimpleNamespace(_is_amx_tile_supported=lambda: True))
    plain = SimpleNamespace(cpu=SimpleNamespace(_is_amx_tile_supported=lambda: False))
    assert (call_positions(amx), call_positions(plain), call_positions(SimpleNamespace())) == (
        AMX_CALL_POSITIONS,
        CALL_POSITIONS,
        CALL_POSITIONS,
    )
    new = {(1,): 80, (2,): 120, (3,): 125}  # 120 would pad 40 after 80; 125 pads 5 after 120
    assert _batches(list(new), new, padding=CALL_POSITIONS) == [[(1,)], [(2,), (3,)]]
    assert _batches(list(new), new, padding=AMX_CALL_POSITIONS) == [[(1,), (2,), (3,)]]
