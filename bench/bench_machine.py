"""What this machine can do for a training step: the floor under `bench_step.py`'s figures.

A GRPO step's train phase is forward and backward passes of the decoder over its positions,
so its time is bounded below by how fast torch multiplies matrices here. This measures, on the
model `bench_step.py` trains (Qwen2.5-Coder-0.5B-Instruct, LoRA rank 8 on every linear layer):

  matmul     torch's float32 and bfloat16 matrix products (GFLOP/s, a 2048 x 896 x 4864 product,
             the shape of the model's MLP), and the CPU capability torch dispatches to
  decoder    forward and backward over one row of W positions (positions per second), with
             gradient checkpointing on and off, with no mask (causal) and with the 4D additive
             mask prefix-tree rows use, in float32 and under bfloat16 autocast (dphil-train's
             --autocast bf16); W from --widths
  llama.cpp  the same model's prompt and generation speed in llama.cpp's server, with and
             without a LoRA adapter written by dphil (tokens per second, the server's own timings)

Writes OUT/KIND.json (KIND: avx2, avx512 or avx512-amx, the CPU's matrix instructions) and
prints each figure as it is measured. Run it on an idle machine:

    dphil-weights --model qwen2.5-coder-0.5b-instruct   # the transformers directory, once
    nice python bench/bench_machine.py [--widths 512,2048] [--threads 2] [--out bench/results/machine]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_step import cpu_kind

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def matmul(torch, threads: int) -> dict:
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 896), torch.randn(896, 4864)
    out = {"cpu_capability": torch.backends.cpu.get_cpu_capability()}
    out["native_bf16"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    bf16_reps = 5 if out["native_bf16"] else 1  # emulated, one product takes half a minute
    for name, dtype, reps in (("float32", torch.float32, 5), ("bfloat16", torch.bfloat16, bf16_reps)):
        x, y = a.to(dtype), b.to(dtype)
        x @ y
        started = time.perf_counter()
        for _ in range(reps):
            x @ y
        seconds = (time.perf_counter() - started) / reps
        out[f"{name}_gflops"] = round(2 * 2048 * 896 * 4864 / seconds / 1e9, 1)
    return out


def decoder(torch, model_dir: str, widths: list[int], precisions: list[str]) -> list[dict]:
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS))
    model.train()
    dec = model.get_base_model().get_decoder()
    rows = []
    for checkpointing in (True, False):
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
        for width in widths:
            ids = torch.randint(0, 150_000, (1, width), generator=torch.Generator().manual_seed(0))
            pos = torch.arange(width)[None]
            allowed = torch.tril(torch.ones(width, width, dtype=torch.bool))
            additive = torch.zeros(1, 1, width, width).masked_fill(~allowed, torch.finfo(torch.float32).min)
            for precision in precisions:
                for mask in ("causal", "additive"):
                    rows.append(one_pass(torch, dec, model, ids, pos, additive, mask, precision))
                    rows[-1] = {"width": width, "checkpointing": checkpointing, **rows[-1]}
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def one_pass(torch, dec, model, ids, pos, additive, mask: str, precision: str) -> dict:
    """Forward and backward once over a row, the loss on its last 16 positions as a step's is."""
    kwargs = {"attention_mask": additive} if mask == "additive" else {}
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    started = time.perf_counter()
    with cast:
        hidden = dec(input_ids=ids, position_ids=pos, use_cache=False, **kwargs).last_hidden_state
        forward = time.perf_counter() - started
        hidden[0, -16:].float().sum().backward()
    total = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    width = ids.shape[1]
    return {
        "precision": precision,
        "mask": mask,
        "forward_s": round(forward, 1),
        "total_s": round(total, 1),
        "positions_per_s": round(width / total, 1),
    }


def llamacpp(gguf: Path, model_dir: str, threads: int) -> list[dict]:
    import peft
    import torch
    import transformers

    from dphil.serving.llamacpp import gguf_architecture
    from dphil.serving.lora_gguf import write_lora_gguf
    from dphil.serving.processes import llamacpp_server

    work = Path(tempfile.mkdtemp(prefix="bench-machine-"))
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS))
    model.save_pretrained(str(work / "adapter"))
    del model
    arch, _ = gguf_architecture(gguf)
    lora = write_lora_gguf(work / "adapter", work / "adapter.gguf", architecture=arch)
    prompt = list(range(1000, 1700))  # 700 tokens, a study-size conversation
    rows = []
    for adapter in (None, lora):
        with llamacpp_server(gguf, threads=threads, lora=adapter) as server:
            for rep in range(2):  # the first warms the server up
                body = {"prompt": prompt, "n_predict": 32, "temperature": 0, "cache_prompt": False}
                req = urllib.request.Request(
                    server.url.removesuffix("/v1") + "/completion",
                    data=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(req, timeout=900) as resp:
                    timings = json.load(resp)["timings"]
                if rep:
                    rows.append(
                        {
                            "adapter": adapter is not None,
                            "prompt_tokens_per_s": round(timings["prompt_per_second"], 1),
                            "generated_tokens_per_s": round(timings["predicted_per_second"], 1),
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="transformers directory (default: dphil's Qwen 0.5B conversion)")
    p.add_argument("--widths", default="512,2048")
    p.add_argument("--precisions", default="float32,bf16", help="decoder passes: float32, bf16 (autocast)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "machine"))
    a = p.parse_args()
    import torch

    from dphil.serving import catalogue, weights

    entry = catalogue.find("qwen2.5-coder-0.5b-instruct")
    gguf = Path(weights.cache_dir()) / entry.file
    model_dir = a.model or str(Path(weights.cache_dir()) / entry.hf_dir)
    torch.set_num_threads(a.threads)
    result = {
        "machine": {"processor": platform.processor() or platform.machine(), "threads": a.threads},
        "matmul": matmul(torch, a.threads),
    }
    print(json.dumps(result), flush=True)
    widths = [int(w) for w in a.widths.split(",")]
    result["decoder"] = decoder(torch, model_dir, widths, a.precisions.split(","))
    result["llamacpp"] = llamacpp(gguf, model_dir, a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{cpu_kind()}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
