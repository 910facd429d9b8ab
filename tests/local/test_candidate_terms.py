"""The candidates' trie and the terms a constrained choice is scored by (dphil.local.candidate_terms)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dphil.local.candidate_terms import CandidateTrie, distinct_terms, term_logprobs
from tests.support.logprobs import LOGPROB_TOLERANCE

# "ACTION: think<eos>", "ACTION: pick_up_left<eos>", "ACTION: pick_up_right<eos>", "ACTION: eat<eos>"
# with made-up ids: ACTION=1, ":"=2, think=3, pick_up=4, left=5, right=6, eat=7, eos=9.
CANDS = [[1, 2, 3, 9], [1, 2, 4, 5, 9], [1, 2, 4, 6, 9], [1, 2, 7, 9]]


def test_the_trie_of_four_replies_by_hand():
    trie = CandidateTrie.of(CANDS)
    assert trie.tokens == (1, 2, 3, 4, 5, 6, 7)
    assert trie.parent == (-1, 0, 1, 1, 3, 3, 1)
    assert trie.depth == (0, 1, 2, 2, 3, 3, 2)
    # "ACTION" from the prompt and ":" from "ACTION" are every candidate's: left out.
    assert trie.terms == (
        ((1, 3), (2, 9)),
        ((1, 4), (3, 5), (4, 9)),
        ((1, 4), (3, 6), (5, 9)),
        ((1, 7), (6, 9)),
    )
    assert trie.sees(4, 0) and trie.sees(4, 3) and trie.sees(4, 4)
    assert not trie.sees(4, 5) and not trie.sees(2, 3) and not trie.sees(0, 1)


def test_one_candidate_keeps_no_term_and_none_is_empty():
    assert CandidateTrie.of([[5, 9]]).terms == ((),)
    assert distinct_terms([]) == []


candidate_sets = st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5), min_size=1, max_size=6, unique_by=tuple)


@settings(max_examples=200, deadline=None)
@given(cands=candidate_sets, seed=st.integers(0, 2**16))
def test_dropped_terms_leave_the_softmax_unchanged(cands, seed):
    """Any number per (position, target), summed per candidate: the softmax over candidates is the same."""
    import random

    rng = random.Random(seed)
    trie = CandidateTrie.of(cands)
    value: dict[tuple[int, int], float] = {}
    full = []
    for cand in cands:
        at, terms = -1, []
        for j, tok in enumerate(cand):
            terms.append((at, tok))
            if j < len(cand) - 1:
                at = next(i for i in range(len(trie.tokens)) if trie.parent[i] == at and trie.tokens[i] == tok)
        full.append(terms)
    for t in {t for terms in full for t in terms}:
        value[t] = rng.uniform(-5, 0)

    def softmax(sums):
        top = max(sums)
        z = sum(math.exp(s - top) for s in sums)
        return [math.exp(s - top) / z for s in sums]

    want = softmax([sum(value[t] for t in terms) for terms in full])
    got = softmax([sum(value[t] for t in terms) for terms in trie.terms])
    assert got == pytest.approx(want, abs=1e-12)
    # Each candidate keeps only its own terms, and none is left that all hold.
    assert all(set(terms) <= set(f) for terms, f in zip(trie.terms, full, strict=True))
    assert not set.intersection(*(set(t) for t in trie.terms))


def test_term_logprobs_equal_the_head_pair_by_pair(lm):
    """Repeated pairs and a position with several targets: each as the head gives it alone."""
    torch = lm.torch
    hidden = torch.randn(5, lm._parts()[1].weight.shape[1])
    predictors = [0, 3, 3, 0, 4, 3]
    targets = [7, 2, 9, 7, 1, 2]
    with torch.no_grad():
        got = term_logprobs(lm, hidden, predictors, targets, 0.7)
        pairs = zip(predictors, targets, strict=True)
        want = torch.stack([lm._head_logprobs(hidden[p : p + 1], torch.tensor([[t]]), 0.7)[0, 0] for p, t in pairs])
    assert got.shape == (6,)
    assert torch.allclose(got, want, **LOGPROB_TOLERANCE)
    assert term_logprobs(lm, hidden, [], [], 1.0).shape == (0,)
