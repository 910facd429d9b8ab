"""The plain computation the policy's log-probabilities are held to, and how close is close enough."""

from __future__ import annotations

import torch

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


def prompts_of(lm):
    texts = ["Round 1 of 5. You hold no fork.", "You are philosopher 2. The left fork is free. Choose.", "ACTION"]
    return [lm.prompt_ids([{"role": "user", "content": t}]) for t in texts]


def plain_sequence_logprob(lm, prompt, completion, temperature=1.0):
    """Sum of log p(completion | prompt) from one unpadded forward pass with full logits."""
    ids = torch.tensor([prompt + completion])
    logits = lm.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)
