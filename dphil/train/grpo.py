"""The GRPO objective: group-relative advantages and a token-level clipped policy gradient.

Episodes of one scenario form a group; each episode's advantage is its reward
minus the group mean, divided by the group's standard deviation. A group whose
episodes all scored the same has no signal (all advantages zero) and is
counted, because a run full of such groups is not learning, whatever its loss
says. The loss averages over every generated token of the step (not per
sequence first), clips the importance ratio as PPO does, and can add a KL
penalty towards the base model.

Advantages are plain Python; the loss imports torch when it is called.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GroupAdvantages:
    """Advantages of one group's episodes, and whether the group carried any signal."""

    advantages: list[float]
    mean: float
    std: float
    zero_std: bool


def group_advantages(rewards: Sequence[float], *, scale: bool = True, eps: float = 1e-6) -> GroupAdvantages:
    """(r - mean) / (std + eps) within a group; all zeros when every reward is the same.

    `scale=False` gives Dr. GRPO's unscaled advantages (r - mean), which do not
    blow up small differences in nearly uniform groups.
    """
    if not rewards:
        raise ValueError("a group needs at least one episode")
    for r in rewards:
        if not math.isfinite(r):
            raise ValueError(f"reward {r!r} is not a finite number")
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    if std <= 1e-12:
        return GroupAdvantages([0.0] * n, mean, 0.0, True)
    denom = std + eps if scale else 1.0
    return GroupAdvantages([(r - mean) / denom for r in rewards], mean, std, False)


def grpo_loss(
    logprobs: Any,
    old_logprobs: Any,
    advantages: Any,
    mask: Any,
    *,
    ref_logprobs: Any | None = None,
    clip_epsilon: float | None = 0.2,
    kl_coef: float = 0.0,
    normaliser: float | None = None,
) -> tuple[Any, dict[str, float]]:
    """The token-level GRPO loss and its diagnostics.

    Shapes: `logprobs`, `old_logprobs`, `ref_logprobs`, `mask` are [B, T]
    (log-probabilities of the sampled tokens under the current policy, the
    policy that sampled them, and the frozen base; mask 1 on generated tokens);
    `advantages` is [B]. `clip_epsilon=None` gives the plain policy gradient.
    KL uses the non-negative k3 estimator exp(ref - lp) - (ref - lp) - 1.
    `normaliser` (the token count of the whole step) lets micro-batches be
    summed into exactly the loss of the full batch; by default this batch's
    own token count.
    """
    import torch

    mask = mask.to(logprobs.dtype)
    tokens = mask.sum().clamp(min=1.0) if normaliser is None else mask.new_tensor(float(normaliser))
    adv = advantages.to(logprobs.dtype).unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs.detach())
    unclipped = ratio * adv
    if clip_epsilon is None:
        objective = unclipped
        clipped_frac = torch.zeros((), dtype=logprobs.dtype)
    else:
        clipped = torch.clamp(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon) * adv
        objective = torch.minimum(unclipped, clipped)
        clipped_frac = ((clipped < unclipped).to(logprobs.dtype) * mask).sum() / tokens
    pg_loss = -(objective * mask).sum() / tokens
    loss = pg_loss
    kl_value = torch.zeros((), dtype=logprobs.dtype)
    if ref_logprobs is not None:
        diff = ref_logprobs.detach() - logprobs
        kl_tokens = torch.exp(diff) - diff - 1.0
        kl_value = (kl_tokens * mask).sum() / tokens
        if kl_coef:
            loss = loss + kl_coef * kl_value
    stats = {
        "loss": float(loss.detach()),
        "pg_loss": float(pg_loss.detach()),
        "kl": float(kl_value.detach()),
        "clip_fraction": float(clipped_frac.detach()),
        "tokens": float(mask.sum().detach()),
    }
    return loss, stats
