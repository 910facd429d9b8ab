"""Prefix-tree rows: each shared prefix computed once, every reply scored as on its own prompt.

The planning is checked on random sequences (each sequence's tokens sit at its columns in
order, a row never exceeds its width unless one group alone does, a group never splits, the
mask lets a node see exactly its ancestors and itself); the scoring against
`LocalModel.unit_logprobs` (itself held to the plain full-logit computation in
test_logprobs.py), values and gradients, on conversations that grow turn by turn as
`--memory full` grows them, on the tiny Qwen3 and the tiny Gemma 3 whose 8-token sliding
window is shorter than every prompt.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dphil.local.prefix_tree import plan_rows

sequences = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=9), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(sequences, st.data(), st.integers(1, 30))
def test_every_sequence_sits_whole_in_one_row_and_rows_keep_their_width(seqs, data, width):
    groups = data.draw(st.lists(st.integers(0, 3), min_size=len(seqs), max_size=len(seqs)))
    rows = plan_rows(seqs, groups, max_width=width)
    seen = {}
    for r, row in enumerate(rows):
        assert len(set(zip(row.parents, row.tokens, strict=True))) == row.width  # no node twice
        for s, cols in row.columns.items():
            assert s not in seen
            seen[s] = r
            assert [row.tokens[c] for c in cols] == seqs[s]
            assert [row.depths[c] for c in cols] == list(range(len(seqs[s])))
            assert [row.parents[c] for c in cols] == [-1, *cols[:-1]]
        used = {c for cols in row.columns.values() for c in cols}
        assert used == set(range(row.width))  # nothing in a row that no sequence of it needs
        if len(row.groups) > 1:
            assert row.width <= width
    assert sorted(seen) == list(range(len(seqs)))
    for s, g in enumerate(groups):
        assert all(seen[t] == seen[s] for t, h in enumerate(groups) if h == g)


def test_a_shared_prefix_is_one_set_of_positions():
    system = [7] * 50
    seqs = [[*system, 1, 2], [*system, 1, 3], [*system, 4]]
    (row,) = plan_rows(seqs, [0, 1, 2], max_width=100)
    assert row.width == 50 + 3 + 1
    two = plan_rows(seqs, [0, 1, 2], max_width=53)
    assert [r.width for r in two] == [53, 51]  # the prefix again in the second row, never split


def test_a_replys_last_token_is_a_target_and_never_a_position():
    from dphil.local.tree_logprobs import TreeScorer

    prompt = [1, 2, 3]
    # Three candidates ending in the same end token 9: the ends predict nothing, so the row
    # holds the prompt and the candidates' inner tokens (4, 5, 6, 7) only.
    scorer = TreeScorer(None, [prompt], candidates=[[[4, 9], [5, 9], [6, 7, 9]]], chosen=[0], max_width=100)
    assert scorer.tokens == 3 + 4
    assert scorer.last == [9, 9, 9]
    # A one-token completion adds no position at all; a later prompt that goes on through a
    # reply keeps it (the second sequence needs token 8 as a predictor).
    free = TreeScorer(None, [prompt, [*prompt, 8, 5]], completions=[[8], [6]], max_width=100)
    assert free.tokens == 3 + 2


@settings(max_examples=50, deadline=None)
@given(sequences)
def test_the_mask_lets_a_node_see_its_ancestors_and_itself_only(seqs):
    torch = pytest.importorskip("torch")
    from dphil.local.prefix_tree import row_tensors

    (row,) = plan_rows(seqs, list(range(len(seqs))), max_width=10_000)
    t = row_tensors(torch, row, config=object(), dtype=torch.float32, device="cpu")
    allowed = t.attention_mask[0, 0] == 0
    for i in range(row.width):
        ancestors, c = set(), i
        while c >= 0:
            ancestors.add(c)
            c = row.parents[c]
        assert {j for j in range(row.width) if allowed[i, j]} == ancestors
    assert t.position_ids[0].tolist() == row.depths


# -- scoring on a real (tiny) model ------------------------------------------------------------


def conversations(lm, turns=3, seats=2):
    """Decisions of `seats` philosophers over `turns` turns, each prompt the last one grown by a turn."""
    from dphil.local.model import Decision

    actions = ("eat", "think", "pick-up-left", "put-down-right")
    cands = lm.candidate_ids(actions)
    out = []
    for seat in range(seats):
        msgs = [{"role": "system", "content": "Five philosophers share five forks at a round table."}]
        for t in range(turns):
            observation = f"You are philosopher {seat}. Round {t + 1}. The left fork is free."
            msgs.append({"role": "user", "content": observation})
            k = (seat + 2 * t) % len(actions)
            out.append(Decision(lm.prompt_ids(msgs), cands[k], f"ACTION: {actions[k]}", actions[k], [], k, actions))
            msgs.append({"role": "assistant", "content": f"ACTION: {actions[k]}"})
    return out


def tree_units(lm, decisions, width, temperature):
    """unit_logprobs' [D, T] layout, assembled from the tree's rows."""
    from dphil.local.tree_logprobs import TreeScorer

    torch = lm.torch
    scorer = TreeScorer.of_decisions(lm, decisions, max_width=width)
    parts = {}
    for row in scorer.rows:
        idx, lp, mask = scorer.unit_logprobs(row, temperature=temperature)
        for b, i in enumerate(idx):
            parts[i] = (lp[b], mask[b])
    wide = max(p[0].shape[0] for p in parts.values())
    lp = torch.stack([torch.nn.functional.pad(parts[i][0], (wide - parts[i][0].shape[0], 0)) for i in sorted(parts)])
    mask = torch.stack([torch.nn.functional.pad(parts[i][1], (wide - parts[i][1].shape[0], 0)) for i in sorted(parts)])
    return scorer, lp, mask


def test_constrained_units_equal_the_reply_by_reply_computation_with_gradients(lm, checkpointing):
    # Checkpointed in one wide row, as dphil-train runs; plain in rows of 40 positions, where a
    # shared prefix's gradient is summed across rows.
    width = 4096 if checkpointing else 40
    from tests.support.logprobs import LOGPROB_TOLERANCE, assert_gradients_close

    torch = lm.torch
    decisions = conversations(lm)
    if lm.model.config.model_type.startswith("gemma3"):
        assert all(len(d.prompt_ids) > lm.model.config.sliding_window for d in decisions)
    params = [p for p in lm.model.parameters() if p.requires_grad]
    weights = torch.linspace(-1.0, 1.0, len(decisions))
    scorer, got, mask = tree_units(lm, decisions, width, 0.8)
    g_got = torch.autograd.grad((got[:, 0] * weights).sum(), params)
    plain, _ = lm.unit_logprobs(decisions, temperature=0.8)
    g_plain = torch.autograd.grad((plain[:, 0] * weights).sum(), params)
    assert torch.allclose(got, plain, **LOGPROB_TOLERANCE) and bool(mask.all())
    assert_gradients_close(g_got, g_plain)
    every_prompt = sum(len(d.prompt_ids) + sum(map(len, lm.candidate_ids(d.candidates))) for d in decisions)
    assert scorer.tokens < every_prompt / 2 if width > 1000 else len(scorer.rows) > 1


def test_free_units_equal_the_reply_by_reply_computation_with_gradients(lm, checkpointing):
    from dphil.local.model import Decision
    from tests.support.logprobs import LOGPROB_TOLERANCE, assert_gradients_close

    torch = lm.torch
    replies = ["ACTION: eat", "I think I will wait", "x", "ACTION: think"]
    decisions = [
        Decision(d.prompt_ids, lm.tokenizer.encode(replies[i % 4], add_special_tokens=False), "", None, [])
        for i, d in enumerate(conversations(lm, turns=2))
    ]
    params = [p for p in lm.model.parameters() if p.requires_grad]
    _, got, mask = tree_units(lm, decisions, 4096, 1.0)
    g_got = torch.autograd.grad((got * mask).sum(), params)
    plain, plain_mask = lm.unit_logprobs(decisions, temperature=1.0)
    g_plain = torch.autograd.grad((plain * plain_mask).sum(), params)
    assert torch.equal(mask, plain_mask)
    assert torch.allclose(got, plain, **LOGPROB_TOLERANCE)
    assert_gradients_close(g_got, g_plain)


def test_constrained_and_free_decisions_are_not_mixed(lm):
    from dphil.local.model import Decision
    from dphil.local.tree_logprobs import TreeScorer

    constrained = conversations(lm, turns=1, seats=1)
    free = Decision(constrained[0].prompt_ids, [1, 2], "", None, [])
    with pytest.raises(ValueError, match="cannot be scored together"):
        TreeScorer.of_decisions(lm, [*constrained, free], max_width=100)
