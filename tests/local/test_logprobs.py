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
from dphil.local.model import LORA_TARGETS, LocalModel  # noqa: E402

# The two computations differ only in summation order (packed rows, masked attention, head
# slices recomputed in backward). Log-probabilities are O(1) and are compared element by
# element. A gradient entry is a sum of many terms that cancel, so its float32 rounding is
# relative to the terms, not to the entry: element-wise rtol=1e-4 passed on one machine and
# missed by 1e-5 on another (other BLAS kernels, transformers 5.25). Gradients are therefore
# compared tensor by tensor, as ||got - plain|| / ||plain||. Measured: at most 2e-6 in float32
# (3e-7 even in float64, where the models' RMSNorm still rounds to float32), while a real
# masking error (every query also seeing column 0) gives 2.5: GRAD_RTOL sits 50x above the
# rounding and four orders of magnitude below a bug.
LOGPROB_TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
GRAD_RTOL = 1e-4


def assert_gradients_close(got, plain) -> None:
    for name, (a, b) in enumerate(zip(got, plain, strict=True)):
        error = float((a - b).norm() / b.norm().clamp_min(1e-12))
        assert error <= GRAD_RTOL, f"parameter {name}: relative gradient error {error:.2e} > {GRAD_RTOL:.0e}"


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def lm(request, tmp_path_factory):
    from tests.support.tinymodel import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("lp") / "m", architecture=request.param, layers=3)
    model = LocalModel(str(path), device="cpu", micro_batch=4)
    torch.manual_seed(1)
    model.model = peft.get_peft_model(
        model.model,
        peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM", init_lora_weights=False
        ),
    )
    return model


def prompts_of(lm):
    texts = ["Round 1 of 5. You hold no fork.", "You are philosopher 2. The left fork is free. Choose.", "ACTION"]
    return [lm.prompt_ids([{"role": "user", "content": t}]) for t in texts]


def plain_sequence_logprob(lm, prompt, completion, temperature=1.0):
    """Sum of log p(completion | prompt) from one unpadded forward pass with full logits."""
    ids = torch.tensor([prompt + completion])
    logits = lm.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)


@pytest.fixture(params=[False, True], ids=["plain", "checkpointed"])
def checkpointing(request, lm):
    """Training mode with transformers' gradient checkpointing, as `dphil-train` runs it (or not)."""
    if request.param:
        lm.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lm.model.train()
    yield request.param
    if request.param:
        lm.model.gradient_checkpointing_disable()
        lm.model.eval()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_candidate_logprobs_equal_the_plain_computation_with_gradients(lm, temperature, checkpointing):
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
