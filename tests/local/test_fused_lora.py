"""LoRA's update summed inside addmm: peft's values and gradients, its merge, its saved adapter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


@pytest.fixture(params=["qwen3", "gemma3"])
def pair(request, tmp_path):
    """Two copies of one tiny model with the same non-zero adapter; the second fused."""
    from dphil.local.fused_lora import fuse_lora
    from dphil.local.model import LORA_TARGETS
    from tests.support.tinymodel import build_tiny_model

    path = build_tiny_model(tmp_path / "m", architecture=request.param, layers=2)
    models = []
    for _ in range(2):
        base = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
        torch.manual_seed(3)
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(LORA_TARGETS), init_lora_weights=False)
        models.append(peft.get_peft_model(base, config))
    layers = sum(len(m.lora_A) for m in models[1].modules() if isinstance(m, peft.tuners.lora.layer.Linear))
    assert fuse_lora(models[1]) == layers == 2 * len(LORA_TARGETS)
    assert fuse_lora(models[1]) == 0  # installed once
    return models


def _ids():
    return torch.randint(3, 100, (2, 11), generator=torch.Generator().manual_seed(0))


def _logits_and_grads(model, ids, *, autocast=False):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids).logits.float()
    logits.logsumexp(-1).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logits.detach(), grads


def _calls_to_lora_b(model) -> list[int]:
    """Counts forward calls of the B matrices: peft's path calls them, the fused one reads their weights."""
    calls = [0]
    for module in model.modules():
        if isinstance(module, peft.tuners.lora.layer.Linear):
            for b in module.lora_B.values():
                b.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_values_and_gradients_are_peft_s(pair):
    plain, fused = pair
    ids = _ids()
    plain_calls, fused_calls = _calls_to_lora_b(plain), _calls_to_lora_b(fused)
    a, ga = _logits_and_grads(plain, ids)
    b, gb = _logits_and_grads(fused, ids)
    assert plain_calls[0] == 2 * 7 and fused_calls[0] == 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fused(input_ids=ids)
    assert fused_calls[0] == 0
    assert a.abs().max() > 0.1 and torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    assert ga.keys() == gb.keys() and len(ga) == 4 * 7
    for name in ga:
        assert torch.allclose(ga[name], gb[name], atol=1e-5, rtol=1e-4), name


def test_under_bfloat16_autocast_as_close_to_float32_as_peft_is(pair):
    """Rounding differs (the sum happens inside the product): the error against float32 does not grow."""
    plain, fused = pair
    ids = _ids()
    exact, g_exact = _logits_and_grads(plain, ids)
    a, ga = _logits_and_grads(plain, ids, autocast=True)
    b, gb = _logits_and_grads(fused, ids, autocast=True)
    assert (b - exact).abs().max() <= 1.5 * (a - exact).abs().max() + 1e-3
    ratio = [(gb[n] - g_exact[n]).norm() / ((ga[n] - g_exact[n]).norm() + 1e-3 * g_exact[n].norm()) for n in ga]
    assert max(ratio) < 2.0 and sum(ratio) / len(ratio) < 1.25


def test_sampling_adds_in_place_and_gives_the_same_logits(pair):
    plain, fused = pair
    ids = _ids()
    with torch.no_grad():
        a = plain(input_ids=ids).logits
        b = fused(input_ids=ids).logits
        with fused.disable_adapter():
            base = fused(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    assert (a - base).abs().max() > 1e-3  # the adapter does move the logits


def test_merging_and_saving_are_peft_s(pair, tmp_path):
    plain, fused = pair
    ids = _ids()
    with torch.no_grad():
        want = plain(input_ids=ids).logits
    fused.save_pretrained(str(tmp_path / "fused"))
    plain.save_pretrained(str(tmp_path / "plain"))
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "plain" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "fused" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    merged = fused.merge_and_unload()
    with torch.no_grad():
        got = merged(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-4, rtol=1e-4)
