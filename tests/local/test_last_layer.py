"""The decoder's last layer at some positions only (dphil.local.last_layer) against the whole layer."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from dphil.local import last_layer  # noqa: E402
from dphil.local.model import LORA_TARGETS, LocalModel  # noqa: E402
from tests.support.logprobs import assert_gradients_close  # noqa: E402
from tests.support.tinymodel import build_tiny_model  # noqa: E402


@pytest.fixture(scope="module", params=["qwen2", "qwen3", "gemma3"])
def tiny_lm(request, tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("ll") / "m", architecture=request.param, layers=3)
    lm = LocalModel(str(path), device="cpu", micro_batch=4)
    torch.manual_seed(2)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(LORA_TARGETS), init_lora_weights=False)
    lm.model = peft.get_peft_model(lm.model, config)
    return request.param, lm


def tree_mask(t: int, cache: int, *, seed: int):
    """[1, 1, t, cache + t] bool: each query sees itself, its cache and some keys before it (never ahead)."""
    g = torch.Generator().manual_seed(seed)
    allowed = (torch.rand((t, cache + t), generator=g) < 0.5) & torch.ones((t, cache + t), dtype=torch.bool).tril(cache)
    allowed[torch.arange(t), cache + torch.arange(t)] = True
    return allowed[None, None]


def outputs(lm, keep, *, prune: bool, cache_len: int = 0, mask: bool = True, batch: int = 1):
    """(whether pruned, the decoder's output at keep, LoRA gradients of a projection of it, the last layer's keys)."""
    from transformers import DynamicCache

    decoder = lm._parts()[0]
    g = torch.Generator().manual_seed(7)
    t = 11
    ids = torch.randint(3, 200, (batch, cache_len + t), generator=g)
    past = DynamicCache()
    if cache_len:
        with torch.no_grad():
            decoder(input_ids=ids[:, :cache_len], past_key_values=past, use_cache=True)
    pos = torch.arange(cache_len, cache_len + t).expand(batch, t)
    attn = torch.cat([tree_mask(t, cache_len, seed=s) for s in range(batch)]) if mask else None
    lm.model.zero_grad(set_to_none=True)
    kwargs = dict(input_ids=ids[:, cache_len:], position_ids=pos, attention_mask=attn, use_cache=True)
    pruned = False
    if prune:
        with last_layer.only_at(decoder, keep) as pruned:
            out = decoder(**kwargs, past_key_values=past)
    else:
        out = decoder(**kwargs, past_key_values=past)
    hidden = out.last_hidden_state
    if not pruned:  # the whole layer: read the kept positions as a caller would
        hidden = hidden.gather(1, keep.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    # A random direction: the sum of squares after the final norm is nearly constant, its gradient noise.
    weight = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(3))
    (hidden.float() * weight).sum().backward()
    grads = {n: p.grad.clone() for n, p in lm.model.named_parameters() if p.requires_grad and p.grad is not None}
    cache = out.past_key_values  # none under gradient checkpointing, which turns the cache off
    keys = cache.layers[-1].keys.detach() if cache is not None and cache.layers else None
    return pruned, hidden.detach(), grads, keys


@pytest.mark.parametrize(("cache_len", "mask", "batch"), [(0, True, 1), (5, True, 2), (0, False, 1), (4, False, 1)])
def test_kept_positions_and_gradients_as_the_whole_layer_computes_them(tiny_lm, cache_len, mask, batch):
    arch, lm = tiny_lm
    keep = torch.tensor([[0, 3, 4, 10], [2, 5, 9, 10]][:batch])
    _, whole, whole_grads, whole_keys = outputs(lm, keep, prune=False, cache_len=cache_len, mask=mask, batch=batch)
    pruned, part, part_grads, part_keys = outputs(lm, keep, prune=True, cache_len=cache_len, mask=mask, batch=batch)
    assert pruned == (arch != "gemma3")
    assert part.shape == whole.shape == (batch, 4, whole.shape[-1])
    assert torch.allclose(part, whole, atol=1e-5, rtol=1e-5)
    assert torch.equal(part_keys, whole_keys)  # the cache gets every position's keys
    assert set(part_grads) == set(whole_grads)
    assert_gradients_close([part_grads[n] for n in whole_grads], list(whole_grads.values()))
    # Only Gemma 3 (sliding windows, extra norms) keeps its whole last layer.
    assert last_layer.supported(lm._parts()[0]) == (arch != "gemma3")


def test_a_layer_that_recomputes_itself_keeps_its_whole_output(tiny_lm):
    """Under gradient checkpointing the backward pass replays the layer: it is left whole."""
    arch, lm = tiny_lm
    lm.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.model.train()
    try:
        assert not last_layer.supported(lm._parts()[0])
        keep = torch.tensor([[1, 6]])
        _, whole, whole_grads, _ = outputs(lm, keep, prune=False)
        pruned, part, part_grads, _ = outputs(lm, keep, prune=True)
        assert not pruned
        assert torch.equal(part, whole)
        assert_gradients_close([part_grads[n] for n in whole_grads], list(whole_grads.values()))
    finally:
        lm.model.gradient_checkpointing_disable()
        lm.model.eval()
    assert last_layer.supported(lm._parts()[0]) == (arch != "gemma3")
