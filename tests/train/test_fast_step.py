"""The fast training step against the plain one on the tiny model: same episodes, same loss, same update.

`--pack-width 0` scores every reply on its own prompt (held to the full-logit computation in
tests/local/test_logprobs.py); the default puts the step's replies on prefix-tree rows. Both
backends start from the same adapter, play the same seeds with full memory (so prompts grow
turn by turn and share their system prompt) and take one optimiser step on the same
advantages: the sampled actions, the loss and the gradient must agree. bf16 (autocast,
bfloat16 base weights, or both) is held to the float32 loss within the tolerance measured for it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from dphil.agents.prompts import load_prompt_file  # noqa: E402
from dphil.core.records import EpisodeConfig  # noqa: E402
from dphil.train.peft_backend import PeftBackend, PeftSettings, Sample  # noqa: E402

CONFIGS = [EpisodeConfig(model="hf:tiny", n=3, rounds=3, seed=s) for s in (0, 1)]
# Rows of 256 positions without checkpointing: each seat's stem is computed once for the several
# rows its conversations span.
SHARED = {"pack_width": 256, "gradient_checkpointing": False}


def backend(tiny, prompt_file, **kw) -> PeftBackend:
    settings = PeftSettings(base_model=str(tiny), prompt=load_prompt_file(prompt_file), learning_rate=1e-2, **kw)
    return PeftBackend(settings)


def samples_of(played) -> list[Sample]:
    decisions = [d for p in played for d in p.decisions]
    return [Sample(d, 0.25 + (-1.0) ** i * (1 + i % 3) / 3) for i, d in enumerate(decisions)]


def record_gradients(b: PeftBackend) -> list:
    """The adapter's gradients at each optimiser step, as the step sees them (after clipping)."""
    seen: list = []
    step = b.optimizer.step

    def recording(*args, **kwargs):
        seen.append([p.grad.detach().clone() for p in b.lm.model.parameters() if p.requires_grad])
        return step(*args, **kwargs)

    b.optimizer.step = recording
    return seen


@pytest.fixture(scope="module")
def steps(tiny, prompt_file):
    """name -> (gradients, episodes, stats) of one step on its own rollout, name_backend -> the backend."""
    out = {}
    variants = {"plain": {"pack_width": 0}, "tree": {}, "shared": SHARED}
    for name, kw in variants.items():
        b = backend(tiny, prompt_file, **kw)
        played = b.rollout(CONFIGS, seed=3)
        grads = record_gradients(b)
        stats = b.train(samples_of(played))
        out[name] = (grads[0], played, stats)
        out[f"{name}_backend"] = b
    return out


def test_both_play_the_same_episodes(steps):
    (_, plain, _), (_, tree, _), (_, shared, _) = steps["plain"], steps["tree"], steps["shared"]
    for a, b in [*zip(plain, tree, strict=True), *zip(plain, shared, strict=True)]:
        assert [t["action"] for t in a.record["turns"]] == [t["action"] for t in b.record["turns"]]
        for ta, tb in zip(a.record["turns"], b.record["turns"], strict=True):
            for action, p in ta["action_probs"].items():
                assert tb["action_probs"][action] == pytest.approx(p, abs=2e-6)


def test_the_loss_and_the_update_are_the_same(steps):
    from tests.support.logprobs import assert_gradients_close

    (plain_grads, _, ps), (tree_grads, _, ts) = steps["plain"], steps["tree"]
    # At a step's first update the policy is the one that sampled (every ratio 1), so the loss is
    # the advantages' weighted mean either way: the gradient is where the two could differ.
    for key in ("loss", "pg_loss", "tokens", "trained_samples"):
        assert ts[key] == pytest.approx(ps[key], rel=1e-5, abs=1e-6), key
    assert ts["grad_norm"] == pytest.approx(ps["grad_norm"], rel=1e-4)
    assert_gradients_close(tree_grads, plain_grads)
    # Every prompt shares the system prompt and grows turn by turn: far fewer positions.
    assert ts["positions"] < ps["positions"] / 2


def test_a_stem_computed_once_gives_the_same_update(steps):
    from dphil.local.tree_logprobs import TreeScorer
    from tests.support.logprobs import assert_gradients_close

    (plain_grads, played, ps), (shared_grads, _, ss) = steps["plain"], steps["shared"]
    for key in ("loss", "pg_loss", "tokens", "trained_samples"):
        assert ss[key] == pytest.approx(ps[key], rel=1e-5, abs=1e-6), key
    assert_gradients_close(shared_grads, plain_grads)
    # The same rows computed whole would hold each seat's stem once per row.
    b = steps["shared_backend"]
    whole = TreeScorer.of_decisions(b.lm, [d for p in played for d in p.decisions], max_width=SHARED["pack_width"])
    assert len(whole.rows) > 2 and ss["positions"] < whole.tokens
    assert b.arithmetic()["shared_prefix"] is True


@pytest.mark.parametrize(
    "kw",
    [{"autocast": "bf16"}, {"dtype": "bfloat16"}, {"dtype": "bfloat16", "autocast": "bf16"}],
    ids=["autocast", "bf16-weights", "bf16-weights+autocast"],
)
def test_bf16_keeps_the_loss_within_its_tolerance(tiny, prompt_file, steps, kw):
    (_, played, fp32) = steps["plain"]
    b = backend(tiny, prompt_file, **kw)
    stats = b.train(samples_of(played))
    # Same samples, same starting adapter (float32 whatever the base weights' dtype, as peft
    # keeps it): only the arithmetic differs. bfloat16 keeps 8 bits of
    # mantissa, so log-probabilities move by up to a few 1e-2 on this model; the loss averages them.
    assert stats["loss"] == pytest.approx(fp32["loss"], abs=0.05)
    assert stats["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=0.1)
    assert all(p.dtype == torch.float32 for p in b.lm.model.parameters() if p.requires_grad)
    # The checkpoint record says which arithmetic the step used.
    assert b.arithmetic()["dtype"] == kw.get("dtype", "float32")
    assert b.arithmetic()["autocast"] == kw.get("autocast")


def test_a_cpu_that_emulates_bf16_is_named_before_training():
    from dphil.local.loading import slow_bf16

    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    why = slow_bf16("cpu")
    assert (why is None) == native
    if why is not None:  # an AVX2 machine: the warning says what torch runs on
        assert torch.backends.cpu.get_cpu_capability() in why and "emulated" in why


def test_a_stem_computed_once_keeps_the_kl_term(tiny, prompt_file, steps):
    """With --kl-coef the reference (adapter off, no gradient) is scored on whole rows beside the stems."""
    from tests.support.logprobs import assert_gradients_close

    trained = [p.detach().clone() for p in steps["plain_backend"].lm.model.parameters() if p.requires_grad]
    _, played, _ = steps["plain"]
    got = {}
    for name, kw in {"plain": {"pack_width": 0}, "shared": SHARED}.items():
        b = backend(tiny, prompt_file, kl_coef=0.5, **kw)
        # A trained adapter (the plain step's), so the policy and the reference differ.
        for p, w in zip((p for p in b.lm.model.parameters() if p.requires_grad), trained, strict=True):
            p.data.copy_(w)
        grads = record_gradients(b)
        stats = b.train(samples_of(played))
        got[name] = (grads[0], stats)
    (g_plain, s_plain), (g_shared, s_shared) = got["plain"], got["shared"]
    assert s_plain["kl"] > 0 and s_shared["kl"] == pytest.approx(s_plain["kl"], rel=1e-4)
    assert s_shared["loss"] == pytest.approx(s_plain["loss"], rel=1e-4, abs=1e-6)
    assert s_shared["positions"] < s_plain["positions"]
    assert_gradients_close(g_shared, g_plain)


def test_under_autocast_skipping_peft_input_casts_changes_no_value(tiny, prompt_file):
    """peft casts each LoRA input to the float32 adapter weights and autocast casts it back: skipped."""
    import contextlib
    from unittest.mock import patch

    import peft.helpers

    from tests.support.logprobs import assert_gradients_close

    out = {}
    for name in ("skipped", "cast"):
        b = backend(tiny, prompt_file, dtype="bfloat16", autocast="bf16")
        torch.manual_seed(5)  # a nonzero B (peft starts it at zero), the same in both
        for n, p in b.lm.model.named_parameters():
            if "lora_B" in n:
                p.data.normal_(0.0, 0.05)
        grads = record_gradients(b)
        keep = (
            contextlib.nullcontext()
            if name == "skipped"
            else patch.object(peft.helpers, "disable_input_dtype_casting", lambda model: contextlib.nullcontext())
        )
        with keep:
            with b._autocast():  # every LoRA layer's cast off, unless patched back on
                flags = {m.cast_input_dtype_enabled for m in b.lm.model.modules() if hasattr(m, "lora_A")}
            assert flags == {name == "cast"}
            played = b.rollout(CONFIGS, seed=3)
            stats = b.train(samples_of(played))
        out[name] = (played, stats, grads[0])
    (a, sa, ga), (c, sc, gc) = out["skipped"], out["cast"]
    for x, y in zip(a, c, strict=True):
        assert [t["action_probs"] for t in x.record["turns"]] == [t["action_probs"] for t in y.record["turns"]]
    assert sa["loss"] == sc["loss"]
    assert_gradients_close(ga, gc)
