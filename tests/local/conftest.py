"""The tiny models with a LoRA adapter that the log-probability tests score, in training mode or not."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def lm(request, tmp_path_factory):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from dphil.local.model import LORA_TARGETS, LocalModel
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
