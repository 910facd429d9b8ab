"""The policy's log-probabilities against the plain computation (full logits over every position).

`LocalModel` never materialises logits over the vocabulary for whole prompts:
it stops at the decoder's hidden states and runs the head only on the
completion tokens' positions, a slice at a time, recomputed in the backward
pass; constrained candidates are packed after their prompt in one row under
masks of dphil's own (`dphil.local.packing`). These tests hold both to the
straightforward way, values and gradients alike, on the tiny Qwen3 and on a
tiny Gemma 3 whose sliding window (8 tokens) is shorter than every prompt, so
the masks must reproduce the model's own windowed attention; and again with
gradient checkpointing on, as training runs it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from dphil.local import model as hf_policy  # noqa: E402
from tests.support.logprobs import (  # noqa: E402
    LOGPROB_TOLERANCE,
    assert_gradients_close,
    plain_sequence_logprob,
    prompts_of,
)


def test_candidate_logprobs_equal_the_plain_computation_with_gradients(lm, checkpointing):
    # The temperature only enters the head, which checkpointing does not change: one of each.
    temperature = 0.7 if checkpointing else 1.0
    if lm.model.config.model_type.startswith("gemma3"):
        assert all(len(p) > lm.model.config.sliding_window for p in prompts_of(lm))
    prompts = prompts_of(lm)
    cands = lm.candidate_ids(("eat", "think", "pick-up-left", "put-down-right"))
    params = [p for p in lm.model.parameters() if p.requires_grad]
    got = lm.candidate_logprobs(prompts, cands, temperature=temperature)
    g_got = torch.autograd.grad(got[:, 0].sum() + 0.5 * got[:, 2].sum(), params)
    plain = torch.stack(
        [
            torch.log_softmax(torch.stack([plain_sequence_logprob(lm, p, c, temperature).sum() for c in cands]), -1)
            for p in prompts
        ]
    )
    g_plain = torch.autograd.grad(plain[:, 0].sum() + 0.5 * plain[:, 2].sum(), params)
    assert torch.allclose(got, plain, **LOGPROB_TOLERANCE)
    assert_gradients_close(g_got, g_plain)


def test_token_logprobs_equal_the_plain_computation_with_gradients(lm, monkeypatch, checkpointing):
    # A head slice of 3 rows, so the slicing and its recomputation are exercised on the tiny model too.
    monkeypatch.setattr(hf_policy, "HEAD_BYTES", 3 * 4 * lm.tokenizer.vocab_size)
    prompts = prompts_of(lm)
    completions = [
        lm.tokenizer.encode(t, add_special_tokens=False) for t in ("ACTION: eat", "I think I will wait", "x")
    ]
    pairs = list(zip(prompts, completions, strict=True))
    params = [p for p in lm.model.parameters() if p.requires_grad]
    lp, mask = lm.token_logprobs(pairs, temperature=0.9)
    g_got = torch.autograd.grad((lp * mask).sum(), params)
    width = lp.shape[1]
    total = 0
    for b, (p, c) in enumerate(pairs):
        plain = plain_sequence_logprob(lm, p, c, 0.9)
        assert torch.allclose(lp[b, width - len(c) :], plain, **LOGPROB_TOLERANCE)
        assert mask[b].sum() == len(c) and float(lp[b, : width - len(c)].abs().sum()) == 0
        total = total + plain.sum()
    g_plain = torch.autograd.grad(total, params)
    assert_gradients_close(g_got, g_plain)
