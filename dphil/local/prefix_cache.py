"""Each conversation's keys and values kept between rounds, so sampling computes only a round's new tokens.

With `--memory full` a philosopher's prompt in round r + 1 is its round-r prompt, its reply
and one observation. Without a cache every round computes the whole conversation again (the
prefix tree shares only what the philosophers have in common). Here the decoder's key/value
cache of every prompt is kept; a later prompt that extends a kept one computes only the tokens
after it, then its K candidate replies as one trie (`candidate_terms`: a mask lets each node see
the conversation and its ancestors, at positions continuing the prompt's), and the cache
is cut back to the prompt for the next round. The values are those of a forward pass over the
whole prompt (the same keys at the same positions). Equal prompts (a group's episodes play
the same scenario, so their first prompts are) are scored once; different prompts that open
alike (every seat's first prompt under `--prompt seat-last`) have what they share computed
once and kept as a stem that each extends (`_stems`); a prompt kept whole is reused
up to its last token, and a round's conversations are extended together, in a few batches of
prompts that bring about as many new tokens: a decoder call reads every weight once (thirty
calls a round would read them thirty times), and a padded position costs as much as a real one.

Sampling only: nothing here keeps a gradient. Kept caches hold at most `budget` positions
(least recently used go first); `clear` drops them all, and must be called whenever the weights
change (a training step). Models with sliding-window layers are not cached (their masks would
need the window too): `supports` says which are.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dphil.local.candidate_terms import CandidateTrie, term_logprobs
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
        self.call_positions = call_positions(lm.torch)

    @staticmethod
    def supports(config: Any) -> bool:
        return all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ["full_attention"])

    def clear(self) -> None:
        self.entries.clear()

    def candidate_logprobs(self, prompts: Sequence[list[int]], cands: list[list[int]], *, temperature: float) -> Any:
        """[D, K]: each candidate's log-probability among the K after each prompt (no gradient).

        Equal prompts are scored once. The others are extended together, a batch per call of
        the decoder, grouped by how many new tokens they bring so that each batch pads at most
        what a call costs (`call_positions`).
        """
        torch = self.lm.torch
        temperature = temperature or 1.0
        unique = list(dict.fromkeys(tuple(p) for p in prompts))
        scores: dict[tuple[int, ...], Any] = {}
        with torch.no_grad():
            for stem in self._stems(unique):
                self._prefill(list(stem))
            starts = {ids: self._start(list(ids)) for ids in unique}
            new = {ids: len(ids) - starts[ids][0] for ids in unique}
            for batch in _batches(unique, new, padding=self.call_positions):
                rows = self._extend([list(ids) for ids in batch], [starts[ids] for ids in batch], cands, temperature)
                scores.update(zip(batch, rows, strict=True))
            stacked = torch.stack([scores[tuple(p)] for p in prompts])
        return torch.log_softmax(stacked, dim=-1)

    def _longest(self, prompt: list[int]) -> tuple[tuple[int, ...], Any] | None:
        """The longest kept prompt that `prompt` extends or equals."""
        best = None
        for ids in self.entries:
            if len(ids) <= len(prompt) and (best is None or len(ids) > len(best)) and tuple(prompt[: len(ids)]) == ids:
                best = ids
        return None if best is None else (best, self.entries[best])

    def _start(self, prompt: list[int]) -> tuple[int, Any]:
        """(positions taken from a kept cache, its [(keys, values)] per layer, or None)."""
        found = self._longest(prompt)
        if found is None:
            return 0, None
        past = len(found[0])
        # Kept whole: its last token again, for the candidates' first.
        return (past - 1, found[1]) if past == len(prompt) else (past, found[1])

    def _stems(self, prompts: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """Openings several prompts share beyond what is kept, each worth a call of its own.

        Sorted, prompts that open alike are neighbours: a run of neighbours whose common
        opening goes more than a call's cost (`call_positions`) past the longer of their kept
        prefixes shares that opening, computed once instead of once per prompt. One level: a
        stem inside a stem is not looked for.
        """
        ordered = sorted(prompts)
        kept = [self._start(list(ids))[0] for ids in ordered]
        out: list[tuple[int, ...]] = []
        run_start, run_len = 0, 0
        for i in range(len(ordered) + 1):
            common = _common(ordered[i - 1], ordered[i]) if 0 < i < len(ordered) else 0
            if i and i < len(ordered) and common - max(kept[i - 1], kept[i]) > self.call_positions:
                run_len = min(run_len, common) if i - run_start > 1 else common
                continue
            if i - run_start > 1:
                out.append(ordered[run_start][:run_len])
            run_start = i
        return out

    def _prefill(self, ids: list[int]) -> None:
        """Keep `ids`' keys and values, computed after the longest kept prompt it extends."""
        from transformers import DynamicCache

        lm = self.lm
        torch = lm.torch
        past, state = self._start(ids)
        new = ids[past:]
        n = len(new)
        pos = torch.arange(past, past + n)[None]
        allowed = torch.ones((1, n, past + n), dtype=torch.bool)
        allowed[0, :, past:] = torch.ones((n, n), dtype=torch.bool).tril()
        kv_pos = torch.cat([torch.arange(past)[None], pos], dim=1)
        decoder, lm_head, _ = lm._parts()
        masks = layer_masks(torch, allowed, kv_pos, decoder.config, lm_head.weight.dtype)
        _, cache = lm._hidden(
            keep=torch.tensor([[n - 1]], device=lm.device),
            input_ids=torch.tensor([new], device=lm.device),
            position_ids=pos.to(lm.device),
            attention_mask={k: v.to(lm.device) for k, v in masks.items()} if isinstance(masks, dict) else masks,
            past_key_values=_padded([(past, state)], past) if past else DynamicCache(),
            use_cache=True,
        )
        self._keep(
            tuple(ids), [(x.keys[:, :, : past + n].clone(), x.values[:, :, : past + n].clone()) for x in cache.layers]
        )
        self.reused += past
        self.computed += n

    def _extend(self, prompts: list[list[int]], starts: list[tuple[int, Any]], cands, temperature: float) -> list:
        """Each prompt's K candidate scores (unnormalised), its new tokens computed in one batch.

        Row d holds its kept keys and values right-aligned in the first P columns, then its new
        tokens, the candidates' trie and padding. Query i of row d may see its own kept columns,
        its new tokens up to itself (a trie node: all of them), and within the trie only its
        ancestors and itself; a padding query sees itself only. The scores leave out the terms
        every candidate holds (their softmax is the same).
        """
        from transformers import DynamicCache

        lm = self.lm
        torch = lm.torch
        decoder, lm_head, _ = lm._parts()
        trie = CandidateTrie.of(cands)
        tail = list(trie.tokens)
        depth_t = torch.tensor(trie.depth, dtype=torch.long)
        m, d = len(tail), len(prompts)
        cand_block = torch.tensor([[trie.sees(i, j) for j in range(m)] for i in range(m)], dtype=torch.bool)
        pasts = [past for past, _ in starts]
        news = [p[past:] for p, past in zip(prompts, pasts, strict=True)]
        big_p, big_q = max(pasts), max(len(n) for n in news) + m
        ids = torch.full((d, big_q), lm.tokenizer.pad_token_id or 0, dtype=torch.long)
        pos = torch.zeros((d, big_q), dtype=torch.long)
        allowed = torch.zeros((d, big_q, big_p + big_q), dtype=torch.bool)
        for r, (new, past) in enumerate(zip(news, pasts, strict=True)):
            n = len(new)
            ids[r, : n + m] = torch.tensor(new + tail)
            pos[r, :n] = torch.arange(past, past + n)
            pos[r, n : n + m] = past + n + depth_t
            allowed[r, : n + m, big_p - past : big_p] = True
            allowed[r, :n, big_p : big_p + n] = torch.ones((n, n), dtype=torch.bool).tril()
            allowed[r, n : n + m, big_p : big_p + n] = True
            allowed[r, n : n + m, big_p + n : big_p + n + m] = cand_block
            free = torch.arange(n + m, big_q)
            allowed[r, free, big_p + free] = True
        kept = _padded(starts, big_p) if big_p else DynamicCache()
        kv_pos = torch.cat([torch.zeros((d, big_p), dtype=torch.long), pos], dim=1)
        masks = layer_masks(torch, allowed, kv_pos, decoder.config, lm_head.weight.dtype)
        # Only the positions that predict a candidate's token are read: the prompt's last and the
        # trie's inner nodes (node -1 is the prompt's last), the same ones in every row.
        readers = sorted({node for terms in trie.terms for node, _ in terms})
        keep = torch.tensor([[len(new) + node for node in readers] for new in news], dtype=torch.long)
        hidden, cache = lm._hidden(
            keep=keep.to(lm.device),
            input_ids=ids.to(lm.device),
            position_ids=pos.to(lm.device),
            attention_mask={k: v.to(lm.device) for k, v in masks.items()} if isinstance(masks, dict) else masks,
            past_key_values=kept,
            use_cache=True,
        )
        column = {node: j for j, node in enumerate(readers)}
        predictors: list[int] = []
        targets: list[int] = []
        owners: list[int] = []
        for r, (prompt, new, past) in enumerate(zip(prompts, news, pasts, strict=True)):
            n = len(new)
            # The kept columns and the new ones are adjacent: the prompt's cache, copied out of the batch.
            span = slice(big_p - past, big_p + n)
            state = [(x.keys[r : r + 1, :, span].clone(), x.values[r : r + 1, :, span].clone()) for x in cache.layers]
            self._keep(tuple(prompt), state)
            self.reused += past
            self.computed += n + m
            # A candidate's first token is predicted by the prompt's last position, a later one by its parent node.
            for k, terms in enumerate(trie.terms):
                for node, tok in terms:
                    predictors.append(r * len(readers) + column[node])
                    targets.append(tok)
                    owners.append(r * len(cands) + k)
        flat = term_logprobs(lm, hidden.reshape(d * len(readers), -1), predictors, targets, temperature)
        scores = torch.zeros((d * len(cands),), dtype=flat.dtype, device=flat.device)
        scores = scores.index_add(0, torch.tensor(owners, dtype=torch.long, device=flat.device), flat)
        return list(scores.view(d, len(cands)))

    def _keep(self, ids: tuple[int, ...], cache: Any) -> None:
        self.entries[ids] = cache
        self.entries.move_to_end(ids)
        while len(self.entries) > 1 and sum(len(k) for k in self.entries) > self.budget:
            self.entries.popitem(last=False)


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many tokens `a` and `b` open with alike."""
    k, end = 0, min(len(a), len(b))
    while k < end and a[k] == b[k]:
        k += 1
    return k


def _padded(starts: list[tuple[int, Any]], width: int) -> Any:
    """The rows' kept keys and values, right-aligned in `width` columns (zeros before: masked)."""
    from transformers import DynamicCache

    first = next(state for _, state in starts if state is not None)
    layers = []
    for layer, (k0, v0) in enumerate(first):
        keys = k0.new_zeros((len(starts), k0.shape[1], width, k0.shape[3]))
        values = v0.new_zeros((len(starts), v0.shape[1], width, v0.shape[3]))
        for r, (past, state) in enumerate(starts):
            if past:
                keys[r, :, width - past :] = state[layer][0][0, :, :past]
                values[r, :, width - past :] = state[layer][1][0, :, :past]
        layers.append((keys, values))
    return DynamicCache(ddp_cache_data=layers)


# A decoder call reads every weight once, which costs about as much as computing a few dozen
# positions (Qwen2.5-0.5B in bfloat16 on two AVX-512 cores: about 80 ms, then 2.7 ms a position); a padded
# position costs as much as a real one. So a prompt joins the batch before it only while padding
# every row to the longest leaves at most this many positions padding. With AMX tiles a call also
# repacks every weight (a product over 256 rows took what one over 64 did): a few hundred.
CALL_POSITIONS = 32
AMX_CALL_POSITIONS = 256


def call_positions(torch: Any) -> int:
    """What one decoder call costs beyond its positions, in positions, on this CPU."""
    amx = getattr(getattr(torch, "cpu", None), "_is_amx_tile_supported", None)
    try:
        return AMX_CALL_POSITIONS if amx is not None and amx() else CALL_POSITIONS
    except RuntimeError:
        return CALL_POSITIONS


def _batches(
    prompts: list[tuple[int, ...]], new: dict[tuple[int, ...], int], *, padding: int = CALL_POSITIONS
) -> list[list[tuple[int, ...]]]:
    """Prompts grouped by their count of new tokens, fewest first, each batch padding at most `padding`."""
    out: list[list[tuple[int, ...]]] = []
    for ids in sorted(prompts, key=new.__getitem__):
        # Sorted, so `ids` is the batch's longest: every row before it is padded to it.
        if out and len(out[-1]) * new[ids] - sum(new[b] for b in out[-1]) <= padding:
            out[-1].append(ids)
        else:
            out.append([ids])
    return out
