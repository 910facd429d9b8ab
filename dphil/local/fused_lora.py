"""LoRA's update accumulated inside one matrix product: `result += s · (A x) Bᵀ`.

peft adds a LoRA layer's update as `result + B(A(x)) * s`: the rank-r product
writes a full-width tensor, the scale reads and writes it again, the sum a third
time, and the backward pass repeats the scale. On a CPU in bfloat16 those passes
over a [tokens, out] tensor cost several times the rank-8 product itself (gate
and up projections, 4,864 wide, most of all): about a tenth of a training step.
`addmm` does the same sum in the product's own accumulation, the scale as its
`alpha`, so the value differs from peft's only by rounding, and the parameters,
their initialisation and the saved adapter are peft's own. Sampling (no
gradients) adds in place into the base layer's output.

Installed per layer as a peft `LoraVariant` (peft's hook for DoRA and the like):
layers that already have a variant, LoRA biases or mixed dtypes outside autocast
keep peft's computation.
"""

from __future__ import annotations

from typing import Any

from dphil.local.loading import import_torch_stack


def fuse_lora(model: Any) -> int:
    """Install the fused update on every plain LoRA linear layer of `model`; returns how many."""
    torch, _ = import_torch_stack()
    from peft.tuners.lora.layer import Linear, LoraVariant

    class FusedLora(LoraVariant):
        """peft's vanilla LoRA, with the update summed by addmm (see the module's docstring)."""

        @staticmethod
        def init(module: Any, adapter_name: str) -> None:
            return None

        @staticmethod
        def merge_safe(module: Any, active_adapter: str, orig_weight: Any) -> Any:
            return orig_weight + module.get_delta_weight(active_adapter).to(orig_weight.dtype)

        @staticmethod
        def merge_unsafe(module: Any, active_adapter: str, orig_weight: Any) -> None:
            orig_weight.data += module.get_delta_weight(active_adapter).to(orig_weight.dtype)

        @staticmethod
        def unmerge(module: Any, active_adapter: str, orig_weight: Any) -> Any:
            return orig_weight - module.get_delta_weight(active_adapter).to(orig_weight.dtype)

        @staticmethod
        def forward(module: Any, active_adapter: str, x: Any, result: Any, **kwargs: Any) -> Any:
            lora_b = module.lora_B[active_adapter]
            scale = module.scaling[active_adapter]
            h = module.lora_A[active_adapter](module.lora_dropout[active_adapter](x))
            autocast = torch.is_autocast_enabled(result.device.type)
            if (
                h.dtype != result.dtype
                or (lora_b.weight.dtype != result.dtype and not autocast)
                or not result.is_contiguous()
            ):
                return result + lora_b(h) * scale
            flat, h = result.view(-1, result.shape[-1]), h.reshape(-1, h.shape[-1])
            if not torch.is_grad_enabled():  # sampling: into the base output, which nothing saved
                return flat.addmm_(h, lora_b.weight.to(result.dtype).t(), alpha=scale).view(result.shape)
            return torch.addmm(flat, h, lora_b.weight.t(), alpha=scale).view(result.shape)

    fused = 0
    for module in model.modules():
        if not isinstance(module, Linear):
            continue
        for name in module.lora_A:
            if name in module.lora_variant or module.lora_B[name].bias is not None:
                continue
            module.lora_variant[name] = FusedLora()
            fused += 1
    return fused
