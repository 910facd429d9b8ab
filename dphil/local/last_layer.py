"""The decoder's last layer computed only at the positions whose output is read.

dphil reads a forward pass's output at few positions: a row of 2,048 trie nodes predicts its
scored tokens at a few hundred, a sampling batch its candidates at a dozen per prompt. Every
layer but the last must compute every position (a later layer's keys and values come from it),
but the last layer's queries, attention output, MLP and residual matter only where the head
reads them; elsewhere it needs only its keys and values (for the cache a later call or a row
reads). With `only_at(decoder, keep)` the last layer computes its keys and values everywhere and
the rest only at `keep` ([B, K] positions per batch row), and the decoder's output is [B, K, H]:
the same values as the whole layer's at those positions, up to the attention kernel's rounding.
For Qwen2.5-0.5B that is 23 of 24 layers for the positions nobody reads.

Only for layers built as Qwen2's and Qwen3's are (an attention block and an MLP, each after its
own norm, full attention); other models (Gemma 3's extra norms and sliding windows) and a layer
that recomputes itself under gradient checkpointing keep the whole layer: `supported` says which.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

LAYER_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
ATTENTION_PARTS = {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"}


def supported(decoder: Any) -> bool:
    """Whether the decoder's last layer can compute its output at some positions only."""
    layers = getattr(decoder, "layers", None)
    if not layers:
        return False
    layer = layers[decoder.config.num_hidden_layers - 1]
    attn = getattr(layer, "self_attn", None)
    if attn is None:
        return False
    kinds = getattr(decoder.config, "layer_types", None) or ["full_attention"]
    parts = {name for name, _ in attn.named_children()}
    return (
        {name for name, _ in layer.named_children()} == LAYER_PARTS
        and {"q_proj", "k_proj", "v_proj", "o_proj"} <= parts <= ATTENTION_PARTS
        and kinds[-1] == "full_attention"
        and getattr(attn, "sliding_window", None) is None
        and hasattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb")
        and not (layer.training and (getattr(layer, "gradient_checkpointing", False) or attn.attention_dropout))
    )


@contextlib.contextmanager
def only_at(decoder: Any, keep: Any) -> Iterator[bool]:
    """Within: the decoder's output is its last layer's at `keep` ([B, K] long) only. Yields
    whether it is (False: `supported` says no, and the output is every position's as usual)."""
    if not supported(decoder):
        yield False
        return
    layer = decoder.layers[decoder.config.num_hidden_layers - 1]
    layer.forward = lambda hidden_states, **kwargs: _forward(layer, keep, hidden_states, **kwargs)
    try:
        yield True
    finally:
        del layer.forward  # the class's own again


def _forward(
    layer: Any,
    keep: Any,
    hidden_states: Any,
    attention_mask: Any = None,
    position_embeddings: Any = None,
    cache: Any = None,
    past_key_values: Any = None,
    **kwargs: Any,
) -> Any:
    """The layer as transformers computes it, its queries and everything after them at `keep` only."""
    import torch

    attn = layer.self_attn
    rotate = sys.modules[type(attn).__module__].apply_rotary_pos_emb
    cache = cache if cache is not None else past_key_values
    b, t, _ = hidden_states.shape
    k_count = keep.shape[1]

    def at_keep(x: Any) -> Any:  # [B, T, ...] -> [B, K, ...]
        index = keep.view(b, k_count, *([1] * (x.dim() - 2))).expand(b, k_count, *x.shape[2:])
        return x.gather(1, index)

    normed = layer.input_layernorm(hidden_states)
    query = attn.q_proj(at_keep(normed)).view(b, k_count, -1, attn.head_dim)
    key = attn.k_proj(normed).view(b, t, -1, attn.head_dim)
    value = attn.v_proj(normed).view(b, t, -1, attn.head_dim).transpose(1, 2)
    if hasattr(attn, "q_norm"):
        query, key = attn.q_norm(query), attn.k_norm(key)
    query, key = query.transpose(1, 2), key.transpose(1, 2)
    cos, sin = position_embeddings
    cos, sin = cos.expand(b, *cos.shape[1:]), sin.expand(b, *sin.shape[1:])
    query = rotate(query, query, at_keep(cos), at_keep(sin))[0]
    key = rotate(key, key, cos, sin)[0]
    if cache is not None:
        key, value = cache.update(key, value, attn.layer_idx, kwargs=kwargs)
    mask = attention_mask
    if mask is None:  # the plain causal mask, which transformers leaves to the kernel
        before = key.shape[2] - t
        mask = torch.arange(key.shape[2], device=keep.device).view(1, 1, 1, -1) <= (before + keep).view(b, 1, -1, 1)
    else:
        mask = mask.expand(b, *mask.shape[1:])
        rows = keep.view(b, 1, k_count, 1).expand(b, mask.shape[1], k_count, mask.shape[-1])
        mask = mask.gather(2, rows)
    if torch.is_autocast_enabled(query.device.type):  # as attention runs under autocast
        dtype = torch.get_autocast_dtype(query.device.type)
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    groups = query.shape[1] // key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key.repeat_interleave(groups, dim=1),
        value.repeat_interleave(groups, dim=1),
        attn_mask=mask if mask.dtype == torch.bool else mask.to(query.dtype),
        scale=attn.scaling,
    )
    out = attn.o_proj(out.transpose(1, 2).reshape(b, k_count, -1))
    hidden = at_keep(hidden_states) + out
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))
