"""A prompt and all its candidate replies in one row, each candidate seeing only the prompt and itself.

Constrained decoding (and training on it) needs log p(candidate | prompt) for
the K replies the protocol allows. Running the prompt once and copying its
key/value cache K times costs K copies of every layer's keys and values, and
under gradient all of them are kept for the backward pass; a cache also rules
out gradient checkpointing (the replayed layer would write the cache twice).
Packing avoids both: row b is [padding, prompt_b, cand_1, ..., cand_K], the
candidates' positions continue the prompt's (each restarts at len(prompt)),
and an attention mask lets a candidate token see the prompt and the earlier
tokens of its own candidate, nothing else. The result is the same as K
separate forward passes over prompt + candidate.

Models with sliding-window layers (Gemma 3) get one mask per layer type,
the window measured in positions, as transformers' own masks measure it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class PackedBatch:
    """Row-packed prompts and candidates, and where each candidate token is predicted from."""

    input_ids: Any  # [D, W]
    position_ids: Any  # [D, W]
    attention_mask: Any  # a 4D additive mask [D, 1, W, W], or {layer type: mask}
    last_prompt: int  # column of every prompt's last token (it predicts each candidate's first)
    first_tokens: Any  # [K]: each candidate's first token
    rest_columns: Any  # [R]: column predicting each later candidate token (the column before it)
    rest_tokens: Any  # [R]: those tokens
    rest_candidate: Any  # [R]: which candidate each belongs to


def pack(
    torch: Any,
    prompts: Sequence[list[int]],
    cands: Sequence[list[int]],
    *,
    pad: int,
    config: Any,
    dtype: Any,
    device: Any,
) -> PackedBatch:
    """Left-padded rows of prompt + every candidate, with the masks that keep candidates apart."""
    if not cands or any(not c for c in cands):
        raise ValueError("every candidate needs at least one token")
    tail = [tok for c in cands for tok in c]
    segment_tail = [j for j, c in enumerate(cands) for _ in c]
    offset_tail = [t for c in cands for t in range(len(c))]
    n_tail = len(tail)
    d = len(prompts)
    width = max(len(p) for p in prompts) + n_tail
    body = width - n_tail  # columns before the candidates
    ids = torch.full((d, width), pad, dtype=torch.long)
    pos = torch.zeros((d, width), dtype=torch.long)
    valid = torch.zeros((d, width), dtype=torch.bool)
    tail_ids = torch.tensor(tail, dtype=torch.long)
    offsets = torch.tensor(offset_tail, dtype=torch.long)
    for b, p in enumerate(prompts):
        start = body - len(p)
        ids[b, start:body] = torch.tensor(p, dtype=torch.long)
        ids[b, body:] = tail_ids
        pos[b, start:body] = torch.arange(len(p))
        pos[b, body:] = len(p) + offsets
        valid[b, start:] = True
    segment = torch.cat([torch.full((body,), -1, dtype=torch.long), torch.tensor(segment_tail)])
    masks = _masks(torch, pos, valid, segment, config, dtype)
    later = offsets > 0
    columns = torch.arange(body, width)[later] - 1
    return PackedBatch(
        input_ids=ids.to(device),
        position_ids=pos.to(device),
        attention_mask={k: m.to(device) for k, m in masks.items()} if isinstance(masks, dict) else masks.to(device),
        last_prompt=body - 1,
        first_tokens=torch.tensor([c[0] for c in cands], dtype=torch.long, device=device),
        rest_columns=columns.to(device),
        rest_tokens=tail_ids[later].to(device),
        rest_candidate=torch.tensor(segment_tail)[later].to(device),
    )


def _masks(torch: Any, pos: Any, valid: Any, segment: Any, config: Any, dtype: Any) -> Any:
    """Additive masks (0 where attending is allowed), per layer type when the model has several."""
    q_pos, kv_pos = pos[:, :, None], pos[:, None, :]
    prompt_kv = (segment == -1)[None, None, :]
    own = (segment[:, None] == segment[None, :])[None]
    allowed = valid[:, None, :] & (kv_pos <= q_pos) & (prompt_kv | own)
    # A padding row attends to itself, so it stays finite (a fully masked row is NaN, and
    # 0 x NaN in the backward pass would poison the weights' gradients).
    allowed |= torch.eye(pos.shape[1], dtype=torch.bool)[None]
    return layer_masks(torch, allowed, pos, config, dtype)


def layer_masks(torch: Any, allowed: Any, pos: Any, config: Any, dtype: Any) -> Any:
    """`allowed` [D, W, W] as additive masks, one per layer type when the model has several.

    Sliding-window layers (Gemma 3) also drop keys a window or more positions back,
    measured in `pos` [D, W] as transformers' own masks measure it.
    """
    layer_types = getattr(config, "layer_types", None)
    if not layer_types:
        return _additive(torch, allowed, dtype)
    q_pos, kv_pos = pos[:, :, None], pos[:, None, :]
    out = {}
    for kind in set(layer_types):
        if kind == "full_attention":
            out[kind] = _additive(torch, allowed, dtype)
        elif kind == "sliding_attention":
            window = config.sliding_window
            out[kind] = _additive(torch, allowed & (kv_pos > q_pos - window), dtype)
        else:
            raise ValueError(f"packed rows cannot be masked for {kind!r} layers")
    return out


def _additive(torch: Any, allowed: Any, dtype: Any) -> Any:
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[:, None]
