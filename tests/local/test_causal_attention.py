"""Attention told the mask never looks ahead (dphil.local.causal_attention) against transformers' SDPA."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

import dphil.local.causal_attention as ca  # noqa: E402
from dphil.local.causal_attention import NAME, causal_sdpa_forward, never_looks_ahead  # noqa: E402


def masked(q_len: int, pad: int, *, seed: int, ahead: bool = False, dtype=torch.float32):
    """An additive mask of a random tree-like pattern: each query sees itself and some keys before it."""
    g = torch.Generator().manual_seed(seed)
    kv = q_len + pad
    allowed = (torch.rand((q_len, kv), generator=g) < 0.3) & torch.ones((q_len, kv), dtype=torch.bool).tril(pad)
    allowed[torch.arange(q_len), pad + torch.arange(q_len)] = True
    if ahead:
        allowed[0, kv - 1] = True  # the first query sees the last key
    return torch.zeros((1, 1, q_len, kv), dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min), allowed


def attend(fn, mask, q_len: int, pad: int, *, seed: int, dtype=torch.float32):
    """(output, grads of queries, keys, values) of fn with 4 query heads on 2 key/value heads."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((1, 4, q_len, 16), generator=g).to(dtype).requires_grad_()
    k = torch.randn((1, 2, q_len + pad, 16), generator=g).to(dtype).requires_grad_()
    v = torch.randn((1, 2, q_len + pad, 16), generator=g).to(dtype).requires_grad_()
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    out, weights = fn(module, q, k, v, mask, scaling=0.25)
    assert weights is None and out.shape == (1, q_len, 4, 16)
    out.float().pow(2).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize(("q_len", "pad"), [(70, 0), (70, 23), (70, 70), (1, 0), (20, 70)])
def test_the_same_attention_and_gradients_as_sdpa(q_len, pad):
    mask, allowed = masked(q_len, pad, seed=q_len + pad)
    want = attend(sdpa_attention_forward, mask, q_len, pad, seed=3)
    for m in (mask, allowed[None, None]):  # additive or boolean
        got = attend(causal_sdpa_forward, m, q_len, pad, seed=3)
        for a, b in zip(got, want, strict=True):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_query_heads_stacked_after_a_long_cache_as_sdpa_batch_by_batch():
    """A cache longer than the queries: each key/value head's query heads stacked, rows of a batch apart."""
    g = torch.Generator().manual_seed(5)
    q_len, pad, batch = 12, 50, 3
    allowed = torch.stack([masked(q_len, pad, seed=s)[1] for s in range(batch)])[:, None]
    q = torch.randn((batch, 4, q_len, 16), generator=g)
    k, v = torch.randn((2, batch, 2, q_len + pad, 16), generator=g)
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    calls = []
    real = ca.packed_forward
    ca.packed_forward = lambda *a: calls.append(1) or real(*a)
    try:
        got, _ = causal_sdpa_forward(module, q, k, v, allowed, scaling=0.25)
    finally:
        ca.packed_forward = real
    want, _ = sdpa_attention_forward(module, q, k, v, allowed, scaling=0.25)
    assert calls and got.shape == want.shape == (batch, q_len, 4, 16)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    # each batch row on its own: no row reads another's mask
    for b in range(batch):
        one = slice(b, b + 1)
        alone, _ = causal_sdpa_forward(module, q[one], k[one], v[one], allowed[one], scaling=0.25)
        assert torch.allclose(alone, got[b : b + 1], atol=1e-5, rtol=1e-5)


def test_a_mask_that_looks_ahead_goes_to_sdpa_unchanged():
    mask, _ = masked(40, 10, seed=1, ahead=True)
    assert not never_looks_ahead(mask, 10)
    assert never_looks_ahead(masked(40, 10, seed=1)[0], 10)
    assert not never_looks_ahead(masked(40, 10, seed=1)[0], 9)  # a cache one longer: the diagonal is ahead
    got = attend(causal_sdpa_forward, mask, 40, 10, seed=2)
    want = attend(sdpa_attention_forward, mask, 40, 10, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_verdict_is_kept_for_its_own_mask_only():
    """Layers share a mask's verdict; another mask of the same shape, or an edited one, gets its own."""
    mask, _ = masked(40, 0, seed=6)
    assert never_looks_ahead(mask, 0) and never_looks_ahead(mask, 0)
    assert not never_looks_ahead(masked(40, 0, seed=6, ahead=True)[0], 0)
    mask[..., 0, 39] = 0.0  # the first query now sees the last key
    assert not never_looks_ahead(mask, 0)


def test_a_tree_rows_log_probabilities_and_gradients_as_under_sdpa(lm, monkeypatch):
    """The local model attends through it on a CPU; prefix-tree rows score as they do under SDPA."""
    from dphil.local.tree_logprobs import TreeScorer

    assert lm.model.config._attn_implementation == NAME
    verdicts = []
    real = ca.never_looks_ahead
    monkeypatch.setattr(ca, "never_looks_ahead", lambda mask, pad: verdicts.append(real(mask, pad)) or verdicts[-1])
    prompts = [lm.prompt_ids([{"role": "user", "content": f"You are philosopher {i}. Round 1."}]) for i in range(3)]
    cands = lm.candidate_ids(("think", "eat", "pick_up_left"))

    def run(implementation: str):
        lm.model.set_attn_implementation(implementation)
        lm.model.zero_grad(set_to_none=True)
        scorer = TreeScorer(lm, prompts, candidates=[cands] * 3, chosen=[0, 1, 2], max_width=64)
        total = []
        for row in scorer.rows:
            _, lp, _ = scorer.unit_logprobs(row, temperature=0.9)
            lp.sum().backward()
            total.append(lp.detach())
        grads = [p.grad.clone() for p in lm.model.parameters() if p.requires_grad]
        return torch.cat(total), grads

    try:
        want = run("sdpa")
        got = run(NAME)
    finally:
        lm.model.set_attn_implementation(NAME)
    assert verdicts and all(verdicts)  # the rows' masks went to the kernel told they never look ahead
    assert torch.allclose(got[0], want[0], atol=1e-5, rtol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(got[1], want[1], strict=True))


def test_under_autocast_as_sdpa_runs_there():
    """float32 queries and bfloat16 keys (rotary embeddings in float32 under autocast): SDPA's lower precision."""
    mask, _ = masked(50, 20, seed=4)
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    g = torch.Generator().manual_seed(5)
    q = torch.randn((1, 4, 50, 16), generator=g)
    k, v = (torch.randn((1, 2, 70, 16), generator=g).bfloat16() for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = causal_sdpa_forward(module, q, k, v, mask, scaling=0.25)
        want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.allclose(got.float(), want.float(), atol=2e-2)
