"""The GRPO core and the curriculum: pure functions, no model needed (torch only for the loss)."""

from __future__ import annotations

import math

import pytest

from dphil.io.errors import UsageError
from dphil.train.curriculum import parse_curriculum
from dphil.train.grpo import group_advantages, grpo_loss


def test_group_advantages_are_normalised_within_the_group():
    adv = group_advantages([1.0, 0.0, 0.5])
    assert not adv.zero_std
    assert adv.mean == pytest.approx(0.5)
    assert sum(adv.advantages) == pytest.approx(0.0, abs=1e-9)
    # Population std of (1, 0, 0.5) is sqrt(1/6).
    assert adv.advantages[0] == pytest.approx(0.5 / (math.sqrt(1 / 6) + 1e-6))
    assert adv.advantages[0] > adv.advantages[2] > adv.advantages[1]


def test_a_group_with_equal_rewards_has_no_signal_and_is_counted():
    adv = group_advantages([1.0, 1.0, 1.0])
    assert adv.zero_std and adv.advantages == [0.0, 0.0, 0.0]


def test_unscaled_advantages_and_bad_rewards():
    assert group_advantages([2.0, 0.0], scale=False).advantages == [1.0, -1.0]
    with pytest.raises(ValueError, match="finite"):
        group_advantages([float("nan"), 1.0])
    with pytest.raises(ValueError):
        group_advantages([])


def test_loss_pushes_up_positive_advantage_tokens_and_clips():
    torch = pytest.importorskip("torch")
    logits = torch.zeros(2, 3, requires_grad=True)
    lp = torch.log_softmax(logits, -1)[:, :2]  # two "tokens" per row
    old = lp.detach().clone()
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = grpo_loss(lp, old, torch.tensor([1.0, -1.0]), mask, clip_epsilon=0.2)
    loss.backward()
    # Row 0 (positive advantage) raises its tokens' logits; row 1 lowers its one masked-in token.
    assert logits.grad[0, 0] < 0 and logits.grad[0, 1] < 0
    assert logits.grad[1, 0] > 0
    assert stats["tokens"] == 3.0 and stats["clip_fraction"] == 0.0
    # A ratio far above 1 + eps with a positive advantage is clipped: no gradient, counted.
    lp2 = torch.tensor([[0.0]], requires_grad=True)
    loss2, stats2 = grpo_loss(lp2, torch.tensor([[-1.0]]), torch.tensor([1.0]), torch.ones(1, 1), clip_epsilon=0.2)
    loss2.backward()
    assert lp2.grad.item() == 0.0 and stats2["clip_fraction"] == 1.0
    assert loss2.item() == pytest.approx(-1.2)


def test_kl_penalty_is_zero_at_the_base_and_positive_away_from_it():
    torch = pytest.importorskip("torch")
    lp = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    _, same = grpo_loss(lp, lp, torch.tensor([0.0]), mask, ref_logprobs=lp, kl_coef=0.1)
    assert same["kl"] == pytest.approx(0.0)
    loss, away = grpo_loss(lp, lp, torch.tensor([0.0]), mask, ref_logprobs=lp - 0.5, kl_coef=0.1)
    assert away["kl"] > 0 and loss.item() == pytest.approx(0.1 * away["kl"])


def test_micro_batches_sum_to_the_full_batch_loss():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    lp = torch.randn(4, 3)
    old = lp + 0.05 * torch.randn(4, 3)
    adv = torch.tensor([1.0, -0.5, 0.2, -0.7])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1], [0, 0, 1], [1, 1, 1]], dtype=torch.float32)
    full, _ = grpo_loss(lp, old, adv, mask)
    total = mask.sum().item()
    parts = sum(
        grpo_loss(lp[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2], normaliser=total)[0] for i in (0, 2)
    )
    assert parts.item() == pytest.approx(full.item(), rel=1e-6)


def test_curriculum_stages_and_auto():
    staged = parse_curriculum("5:2,10:1", (5,))
    assert staged.planned_steps == 3
    state = staged.initial_state()
    assert [staged.sizes(s, state) for s in (1, 2, 3, 4)] == [(5,), (5,), (10,), (10,)]
    auto = parse_curriculum("auto", (3, 4), advance_at=0.5, smoothing=0.0)
    s0 = auto.initial_state()
    assert auto.sizes(1, s0) == (3,)
    s1 = auto.advance(s0, 0.2)
    assert auto.sizes(2, s1) == (3,)
    s2 = auto.advance(s1, 0.9)
    assert s2["stage"] == 1 and auto.sizes(3, s2) == (4,)
    assert auto.advance(s2, 5.0)["stage"] == 1  # no size after the last
    fixed = parse_curriculum(None, (5, 10))
    assert fixed.sizes(7, fixed.initial_state()) == (5, 10)


@pytest.mark.parametrize(
    "text,kwargs,match",
    [
        ("5:0", {}, "bad stage"),
        ("5-3", {}, "bad stage"),
        ("1:3", {}, "bad stage"),
        ("auto", {}, "--advance-at"),
        ("5:3", {"advance_at": 0.5}, "only applies"),
    ],
)
def test_bad_curricula_are_usage_errors(text, kwargs, match):
    with pytest.raises(UsageError, match=match):
        parse_curriculum(text, (5, 10), **kwargs)
