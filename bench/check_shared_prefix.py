"""The shared stems of `--shared-prefix` on the real model: the same log-probabilities and gradient, to rounding.

The tiny models' tests hold shared stems to whole rows within float32 rounding; on a real
24-layer model rounding is larger and depends on how a computation is laid out. This plays
one episode of the 0.5B (N = 5, 5 rounds, constrained decoding, float32, a rank-8 LoRA with
random B so every weight has a gradient), then scores its 25 replies three ways, each with
one backward pass per row as dphil-train runs it:

  whole     prefix-tree rows of --width positions, every row computed whole
  shared    the same rows, what neighbouring rows hold computed once (--shared-prefix)
  wide      whole rows of 8,192 positions: another exact layout, for the size of rounding

and writes the largest difference in a reply's log-probability and the relative gradient
difference (||a - b|| / ||b||, the largest over the adapter's tensors) of shared against
whole, and of wide against whole, to OUT/KIND.json. Shared is right when its differences are
no larger than wide's.

    nice python bench/check_shared_prefix.py [--width 900] [--out bench/results/shared_prefix]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from bench_step import cpu_kind, tool

ROOT = Path(__file__).resolve().parent.parent


def score(backend, decisions, *, width: int, shared: bool) -> tuple[dict, list, dict]:
    """({reply: log-probability}, gradients, {positions, rows, families, seconds}) of a weighted sum."""
    import torch

    from dphil.local.tree_logprobs import TreeScorer

    lm = backend.lm
    params = [p for p in lm.model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    started = time.monotonic()
    scorer = TreeScorer.of_decisions(lm, decisions, max_width=width, shared_prefix=shared)
    values = {}
    for row in scorer.rows:
        idx, lp, _ = scorer.unit_logprobs(row, temperature=1.0)
        weights = torch.tensor([(-1.0) ** i * (1 + i % 3) for i in idx])
        (lp[:, 0] * weights).sum().backward()
        scorer.done(row)
        values.update({i: float(lp[b, 0].detach()) for b, i in enumerate(idx)})
    info = {
        "positions": scorer.tokens,
        "rows": len(scorer.rows),
        "families": [[f.rows.start, f.rows.stop, f.stem.width] for f in scorer.families],
        "seconds": round(time.monotonic() - started, 1),
    }
    return values, [p.grad.detach().clone() for p in params], info


def difference(a: tuple, b: tuple) -> dict:
    grads = [float((x - y).norm() / y.norm().clamp_min(1e-12)) for x, y in zip(a[1], b[1], strict=True)]
    return {"max_abs_logprob": max(abs(a[0][i] - b[0][i]) for i in b[0]), "max_relative_gradient": max(grads)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a transformers directory (default: dphil-weights' Qwen 0.5B)")
    p.add_argument("--width", type=int, default=900)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "shared_prefix")
    a = p.parse_args()
    import torch

    from dphil.agents.prompts import builtin_prompt
    from dphil.core.records import EpisodeConfig
    from dphil.train.peft_backend import PeftBackend, PeftSettings

    torch.set_num_threads(a.threads)
    model = (
        a.model
        or subprocess.run(
            [tool("dphil-weights"), "--model", "qwen2.5-coder-0.5b-instruct", "-q"], capture_output=True, check=True
        )
        .stdout.decode()
        .strip()
    )
    settings = PeftSettings(base_model=model, prompt=builtin_prompt(), gradient_checkpointing=False, dtype="float32")
    backend = PeftBackend(settings)
    (played,) = backend.rollout([EpisodeConfig(model=f"hf:{model}", n=5, rounds=5, seed=a.seed)], seed=a.seed)
    decisions = played.decisions
    # Random B (peft starts it at zero): every LoRA weight then has a gradient to compare.
    torch.manual_seed(0)
    for name, param in backend.lm.model.named_parameters():
        if param.requires_grad and "lora_B" in name:
            param.data.normal_(0.0, 0.02)
    backend.lm.model.train()
    whole = score(backend, decisions, width=a.width, shared=False)
    shared = score(backend, decisions, width=a.width, shared=True)
    wide = score(backend, decisions, width=8192, shared=False)
    result = {
        "model": Path(model).name,
        "cpu": cpu_kind(),
        "replies": len(decisions),
        "width": a.width,
        "whole": whole[2],
        "shared": shared[2],
        "wide": wide[2],
        "shared_vs_whole": difference(shared, whole),
        "wide_vs_whole": difference(wide, whole),
    }
    print(json.dumps(result, indent=1))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{cpu_kind()}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
