"""Each conversation's keys and values kept between rounds, so sampling computes only a round's new tokens.

With `--memory full` a philosopher's prompt in round r + 1 is its round-r prompt, its reply
and one observation. Without a cache every round computes the whole conversation again (the
prefix tree shares only what the philosophers have in common). Here the decoder's key/value
cache of every prompt is kept; a later prompt that extends a kept one computes only the tokens
after it, then its K candidate replies as branches (a mask lets each candidate token see the
conversation and its own earlier tokens, at positions continuing the prompt's), and the cache
is cut back to the prompt for the next round. The values are those of a forward pass over the
whole prompt (the same keys at the same positions).

Sampling only: nothing here keeps a gradient. Kept caches hold at most `budget` positions
(least recently used go first); `clear` drops them all, and must be called whenever the weights
change (a training step). Models with sliding-window layers are not cached (their masks would
need the window too): `supports` says which are.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dphil.local.packing import layer_masks

if TYPE_CHECKING:
    from dphil.local.model import LocalModel

# Positions kept across all conversations: about 25 KB each for Qwen2.5-0.5B in float32.
DEFAULT_BUDGET = 65_536


class PrefixCache:
    """Kept key/value caches by the prompt they hold, most recently used last."""

    def __init__(self, lm: LocalModel, *, budget: int = DEFAULT_BUDGET) -> None:
        self.lm = lm
        self.budget = budget
        self.entries: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.reused = 0  # positions read from a kept cache instead of computed
        self.computed = 0  # positions computed

    @staticmethod
    def supports(config: Any) -> bool:
        return all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ["full_attention"])

    def clear(self) -> None:
        self.entries.clear()

    def candidate_logprobs(self, prompts: Sequence[list[int]], cands: list[list[int]], *, temperature: float) -> Any:
        """[D, K]: each candidate's log-probability among the K after each prompt (no gradient)."""
        torch = self.lm.torch
        with torch.no_grad():
            rows = [self._one(list(p), cands, temperature or 1.0) for p in prompts]
        return torch.log_softmax(torch.stack(rows), dim=-1)

    def _longest(self, prompt: list[int]) -> tuple[tuple[int, ...], Any] | None:
        """The kept prompt that `prompt` extends by at least one token, the longest such."""
        best = None
        for ids in self.entries:
            if len(ids) < len(prompt) and (best is None or len(ids) > len(best)) and tuple(prompt[: len(ids)]) == ids:
                best = ids
        return None if best is None else (best, self.entries[best])

    def _one(self, prompt: list[int], cands: list[list[int]], temperature: float) -> Any:
        lm = self.lm
        torch = lm.torch
        decoder, lm_head, _ = lm._parts()
        found = self._longest(prompt)
        # A copy: the same kept prompt may be extended by several replies (a group's episodes).
        past_len, cache = (len(found[0]), copy.deepcopy(found[1])) if found else (0, None)
        new = prompt[past_len:]
        tail = [t for c in cands for t in c]
        seg = [j for j, c in enumerate(cands) for _ in c]
        off = [t for c in cands for t in range(len(c))]
        n, m = len(new), len(tail)
        q = n + m
        pos = torch.tensor([past_len + i for i in range(n)] + [past_len + n + o for o in off])
        # Query i may see: everything kept, the new tokens up to itself (a candidate: all of them),
        # and within the candidates only its own earlier tokens and itself.
        allowed = torch.ones((q, past_len + q), dtype=torch.bool)
        new_cols = torch.arange(n)
        allowed[:n, past_len : past_len + n] = new_cols[None, :] <= new_cols[:, None]
        allowed[:n, past_len + n :] = False
        seg_t, off_t = torch.tensor(seg), torch.tensor(off)
        allowed[n:, past_len + n :] = (seg_t[:, None] == seg_t[None, :]) & (off_t[None, :] <= off_t[:, None])
        kv_pos = torch.cat([torch.arange(past_len), pos])
        masks = layer_masks(torch, allowed[None], kv_pos[None], decoder.config, lm_head.weight.dtype)
        out = decoder(
            input_ids=torch.tensor([new + tail], device=lm.device),
            position_ids=pos[None].to(lm.device),
            attention_mask={k: v.to(lm.device) for k, v in masks.items()} if isinstance(masks, dict) else masks,
            past_key_values=cache if cache is not None else _empty_cache(),
            use_cache=True,
        )
        hidden = out.last_hidden_state[0]
        cache = out.past_key_values
        cache.crop(-m)  # the candidates out: the cache holds the prompt again
        self.reused += past_len
        self.computed += q
        self._keep(tuple(prompt), cache)
        # Each candidate's first token from the prompt's last position, its later ones from the
        # position before them inside the candidate.
        columns = [n - 1 if o == 0 else n + i - 1 for i, o in enumerate(off)]
        flat = lm._head_logprobs(
            hidden[columns], torch.tensor(tail, device=hidden.device).unsqueeze(-1), temperature
        ).squeeze(-1)
        scores = torch.zeros(len(cands), dtype=flat.dtype, device=flat.device)
        return scores.index_add(0, seg_t.to(flat.device), flat)

    def _keep(self, ids: tuple[int, ...], cache: Any) -> None:
        self.entries[ids] = cache
        self.entries.move_to_end(ids)
        while len(self.entries) > 1 and sum(len(k) for k in self.entries) > self.budget:
            self.entries.popitem(last=False)


def _empty_cache() -> Any:
    from transformers import DynamicCache

    return DynamicCache()
