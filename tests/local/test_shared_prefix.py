"""The prefixes several prefix-tree rows hold, computed once per step: the same values and gradients.

Planning on hand-made rows (which nodes the stem holds, and the most-held ones when they do
not fit) and on random sequences (every node two rows hold, laid out depth first, the same
token at the same depth as in its rows); scoring against the rows computed whole, values and
gradients, constrained and free, on the tiny Qwen3 (rows of 60 positions, so each seat's
conversations span several rows and some tokens are predicted from the stem's hidden states)
with and without gradient checkpointing (whose replay of a layer must see the same caches), and
the tiny Gemma 3, whose sliding window rules a cache out: there every row is computed whole.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dphil.local.prefix_tree import plan_rows
from dphil.local.shared_prefix import plan_families


def test_the_nodes_several_rows_hold_are_one_stem():
    opening, seat0, seat1 = [7] * 10, [1] * 40, [2] * 40
    seqs = [[*opening, *seat0, 3, 4], [*opening, *seat0, 5, 6], [*opening, *seat1, 3], [*opening, *seat1, 4]]
    rows = plan_rows(seqs, [0, 1, 2, 3], max_width=53)
    # Seat 0's two sequences do not fit one row; seat 1's do.
    assert [r.width for r in rows] == [52, 52, 52]
    (family,) = plan_families(rows, max_width=100)
    # Held twice: the opening (by all three rows) and seat 0's prompt (by the first two).
    assert family.rows == range(3)
    assert family.stem.tokens == [*opening, *seat0] and family.stem.depths == list(range(50))
    distinct = len({n for r in rows for n in r.nodes})
    assert family.stem.width + sum(n not in family.column for r in rows for n in r.nodes) == distinct
    # A stem may be no wider than asked: the first two rows share 50 nodes, too many for 49, so
    # the first row is computed whole and the next two share the opening.
    (family,) = plan_families(rows, max_width=49, min_shared=5)
    assert family.rows == range(1, 3) and family.stem.tokens == opening
    # Too few positions saved for a pass of their own.
    assert plan_families(rows, max_width=100, min_shared=100) == []


sequences = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=9), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(sequences, st.integers(1, 30), st.integers(1, 40))
def test_a_familys_stem_is_every_node_two_of_its_rows_hold_laid_out_depth_first(seqs, width, stem_width):
    rows = plan_rows(seqs, list(range(len(seqs))), max_width=width)
    families = plan_families(rows, max_width=stem_width, min_shared=1)
    spans = [f.rows for f in families]
    assert all(a.stop <= b.start for a, b in pairwise(spans))  # in order, disjoint
    for f in families:
        holders = Counter(n for i in f.rows for n in rows[i].nodes)
        stem = f.stem
        assert len(f.rows) > 1 and set(stem.nodes) == {n for n, c in holders.items() if c >= 2}
        assert stem.width <= stem_width
        # Each node's parent sits before it, at one depth less, and each subtree is one run of columns.
        for c, p in enumerate(stem.parents):
            assert (p == -1 and stem.depths[c] == 0) or (p < c and stem.depths[p] == stem.depths[c] - 1)
            if p >= 0:
                assert all(stem.parents[j] != -1 and stem.depths[j] > stem.depths[p] for j in range(p + 1, c + 1))
        # The same token at the same depth as in every row of the family that holds the node.
        for i in f.rows:
            for c, n in enumerate(rows[i].nodes):
                if n in f.column:
                    assert stem.tokens[f.column[n]] == rows[i].tokens[c]
                    assert stem.depths[f.column[n]] == rows[i].depths[c]


# -- on a real (tiny) model ------------------------------------------------------------------------


def scored(lm, decisions, *, shared: bool, width: int):
    """(scorer, {decision: units}, gradients) of a weighted sum, row by row as the trainer runs."""
    from dphil.local.tree_logprobs import TreeScorer

    torch = lm.torch
    params = [p for p in lm.model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    scorer = TreeScorer.of_decisions(lm, decisions, max_width=width, shared_prefix=shared)
    values = {}
    for row in scorer.rows:
        idx, lp, mask = scorer.unit_logprobs(row, temperature=0.8)
        weights = torch.tensor([(-1.0) ** i * (1 + i % 3) for i in idx])
        (lp * mask * weights[:, None]).sum().backward()
        scorer.done(row)
        values.update({i: lp[b][mask[b] > 0].detach() for b, i in enumerate(idx)})
    assert scorer._stem is None  # every stem's gradient sent on
    return scorer, values, [p.grad.clone() for p in params]


def predicted_from_the_stem(scorer) -> bool:
    """Whether some scored token is predicted by a column the stem computed (its hidden state the stem's)."""
    return any(
        scorer.rows[i].nodes[c] in f.column
        for f in scorer.families
        for i in f.rows
        for s, cols in scorer.rows[i].columns.items()
        for c in cols[scorer.owner[s][2] - 1 :]
    )


def free_conversations(lm):
    """Free replies whose later prompts go on through them (as --memory full grows them)."""
    from dphil.local.model import Decision
    from tests.local.test_prefix_tree import conversations

    replies = ["ACTION: eat", "I think I will wait", "x", "ACTION: think"]
    return [
        Decision(d.prompt_ids, lm.tokenizer.encode(replies[i % 4], add_special_tokens=False), "", None, [])
        for i, d in enumerate(conversations(lm, turns=3, seats=2))
    ]


@pytest.mark.parametrize("kind", ["constrained", "free"])
def test_a_shared_stem_gives_the_values_and_gradients_of_whole_rows(lm, checkpointing, kind):
    from tests.local.test_prefix_tree import conversations
    from tests.support.logprobs import LOGPROB_TOLERANCE, assert_gradients_close

    torch = lm.torch
    decisions = conversations(lm, turns=3, seats=2) if kind == "constrained" else free_conversations(lm)
    whole, v_whole, g_whole = scored(lm, decisions, shared=False, width=60)
    shared, v_shared, g_shared = scored(lm, decisions, shared=True, width=60)
    assert len(whole.rows) > 2
    for i, v in v_whole.items():
        assert torch.allclose(v_shared[i], v, **LOGPROB_TOLERANCE)
    assert_gradients_close(g_shared, g_whole)
    sliding = "sliding_attention" in (getattr(lm.model.config, "layer_types", None) or [])
    if sliding:
        assert shared.families == [] and shared.tokens == whole.tokens
    else:
        # The system prompt opens every row, each seat's prompt several: computed once per family.
        assert shared.families and shared.tokens < whole.tokens
        # Some tokens are scored from a hidden state the stem computed, not the row.
        assert kind == "constrained" or predicted_from_the_stem(shared)


def test_without_gradient_rows_are_computed_whole(lm):
    from dphil.local.tree_logprobs import TreeScorer
    from tests.local.test_prefix_tree import conversations

    torch = lm.torch
    decisions = conversations(lm, turns=3, seats=2)
    scorer = TreeScorer.of_decisions(lm, decisions, max_width=60, shared_prefix=True)
    with torch.no_grad():
        for row in scorer.rows:
            scorer.unit_logprobs(row, temperature=1.0)
    assert scorer._stem is None  # nothing kept for a backward pass


def test_a_familys_rows_out_of_turn_are_refused(lm):
    from dphil.local.tree_logprobs import TreeScorer
    from tests.local.test_prefix_tree import conversations

    scorer = TreeScorer.of_decisions(lm, conversations(lm, turns=3, seats=2), max_width=60, shared_prefix=True)
    if len(scorer.families) < 2:
        pytest.skip("this model computes every row whole (sliding window)")
    first, second = scorer.families[:2]
    scorer.unit_logprobs(scorer.rows[first.rows[0]], temperature=1.0)
    # The next family's row before the first family's stem got its gradient: refused, not lost.
    with pytest.raises(RuntimeError, match="done"):
        scorer.unit_logprobs(scorer.rows[second.rows[0]], temperature=1.0)
