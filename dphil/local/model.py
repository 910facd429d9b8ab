"""A local transformers model (optionally with a LoRA adapter) that chooses philosophers' actions.

Two ways to decide, both batched over every philosopher waiting for a move:

- `constrained`: each of the protocol's replies (`ACTION: eat` plus the end of
  turn token) is scored under the model and one is sampled in proportion to
  its probability, so even a tiny or untrained model always answers with a
  valid action. The probability trained is that of the chosen reply among the
  candidates, which is exactly the distribution sampled from.
- `free`: the model generates text (with the protocol's tools in its chat
  template when the template supports them) and the reply is parsed like an
  API model's reply; an unreadable reply is `action: null`, as on the API path.

The same object serves `dphil-rollout -m hf:PATH --adapter DIR` (evaluation)
and the peft training backend (which also needs the log-probabilities of what
it sampled). torch and transformers are imported when a model is loaded
(`dphil.local.loading`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dphil.agents.chat_templates import check_chat_template, ensure_chat_template, template_errors
from dphil.io.errors import UsageError
from dphil.local import last_layer
from dphil.local.causal_attention import use_on
from dphil.local.fused_lora import fuse_lora
from dphil.local.loading import (
    eos_ids,
    import_torch_stack,
    load_adapter,
    load_pretrained,
    resolve_device,
    resolve_dtype,
    return_freed_memory,
)
from dphil.local.packing import pack
from dphil.local.prefix_cache import PrefixCache

DECODE_MODES = ("constrained", "free")
# What every constrained reply looks like: the text fallback of the API path.
REPLY_FORMAT = "ACTION: {action}"
# Logits materialised at once by `_head_logprobs` (bytes): 64 rows of Gemma's 262k vocabulary.
HEAD_BYTES = 64 << 20
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class Decision:
    """One philosopher's sampled reply and what training needs to reweight it.

    `old_logprobs` are per generated token (free) or a single value, the
    log-probability of the chosen candidate among all candidates (constrained).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    action: str | None
    old_logprobs: list[float]
    candidate: int | None = None
    candidates: tuple[str, ...] = ()
    extras: dict[str, Any] = field(default_factory=dict)


class LocalModel:
    """A causal LM and its tokenizer, placed on one device, deciding in batches."""

    def __init__(
        self,
        path: str,
        *,
        adapter: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        micro_batch: int = 16,
        pack_width: int = 2048,
        keep_prompts: bool = True,
    ) -> None:
        torch, transformers = import_torch_stack()
        return_freed_memory()
        self.torch = torch
        self.path = path
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.micro_batch = max(1, micro_batch)
        # Positions per prefix-tree row when scoring a round's candidates (0: prompt by prompt).
        self.pack_width = pack_width
        self.tokenizer, model = load_pretrained(transformers, path, self.dtype)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # A base model (Gemma 3 270M) has no chat template: use its family's, from data.
        template = ensure_chat_template(self.tokenizer, getattr(model.config, "model_type", None))
        self.chat_template = "model" if template is None else template.name
        check_chat_template(self.tokenizer, path)  # a template the sandbox refuses: exit 65 now
        self.eos_ids = eos_ids(self.tokenizer, model)
        # Sampling keeps each conversation's keys and values between rounds (`prefix_cache`).
        self.prompt_cache = PrefixCache(self) if keep_prompts and PrefixCache.supports(model.config) else None
        if adapter is not None:
            model = load_adapter(model, adapter, trainable=False)
            fuse_lora(model)  # the update summed inside one matrix product
        use_on(model, self.device)  # attention told that dphil's masks never look ahead
        self.model = model.to(self.device)
        self.model.eval()
        self._candidate_cache: dict[tuple[str, ...], list[list[int]]] = {}

    # -- prompts -------------------------------------------------------------------------
    def prompt_ids(self, messages: list[dict[str, str]], tools: list[dict] | None = None) -> list[int]:
        """The chat template applied to a conversation, ending where the assistant speaks."""
        kwargs: dict[str, Any] = {"add_generation_prompt": True, "enable_thinking": False}
        if tools:
            kwargs["tools"] = tools
        with template_errors(self.path):
            out = self.tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
        if hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)

    def candidate_ids(self, actions: tuple[str, ...]) -> list[list[int]]:
        cached = self._candidate_cache.get(actions)
        if cached is None:
            eos = self.eos_ids[0]
            cached = [
                [*self.tokenizer.encode(REPLY_FORMAT.format(action=a), add_special_tokens=False), eos] for a in actions
            ]
            self._candidate_cache[actions] = cached
        return cached

    # -- deciding ------------------------------------------------------------------------
    def decide(
        self,
        prompts: Sequence[list[int]],
        actions: tuple[str, ...],
        *,
        decode: str = "constrained",
        temperature: float = 1.0,
        max_new_tokens: int = 48,
        seed: int = 0,
        parse=None,
    ) -> list[Decision]:
        """Sample one reply per prompt. `parse(text) -> action | None` reads free replies."""
        if decode == "constrained":
            return self._decide_constrained(prompts, actions, temperature, seed)
        if decode == "free":
            if parse is None:
                raise ValueError("free decoding needs a parse function")
            return self._decide_free(prompts, temperature, max_new_tokens, seed, parse)
        raise UsageError(f"--decode: unknown mode {decode!r} (constrained or free)")

    def _decide_constrained(
        self, prompts: Sequence[list[int]], actions: tuple[str, ...], temperature: float, seed: int
    ) -> list[Decision]:
        torch = self.torch
        cands = self.candidate_ids(actions)
        from dphil.local.tree_logprobs import tree_candidate_logprobs

        with torch.no_grad():  # [D, K], the same values every way
            if self.prompt_cache is not None:  # each kept conversation extended by its new tokens
                scores = self.prompt_cache.candidate_logprobs(prompts, cands, temperature=temperature)
            elif self.pack_width:  # a round's prompts share their system prompt: once per tree row
                width = self.pack_width
                scores = tree_candidate_logprobs(self, prompts, cands, temperature=temperature, max_width=width)
            else:
                scores = self.candidate_logprobs(prompts, cands, temperature=temperature)
        gen = torch.Generator().manual_seed(seed)
        probs = scores.float().exp().cpu()
        # Temperature 0 is greedy: the most likely reply.
        choice = probs.argmax(-1) if temperature == 0 else torch.multinomial(probs, 1, generator=gen).squeeze(-1)
        out = []
        for d, prompt in enumerate(prompts):
            k = int(choice[d])
            out.append(
                Decision(
                    prompt_ids=list(prompt),
                    completion_ids=cands[k],
                    text=REPLY_FORMAT.format(action=actions[k]),
                    action=actions[k],
                    old_logprobs=[float(scores[d, k])],
                    candidate=k,
                    candidates=actions,
                    extras={"action_probs": {a: round(float(probs[d, j]), 6) for j, a in enumerate(actions)}},
                )
            )
        return out

    def _decide_free(
        self,
        prompts: Sequence[list[int]],
        temperature: float,
        max_new_tokens: int,
        seed: int,
        parse,
    ) -> list[Decision]:
        torch = self.torch
        out: list[Decision] = []
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(prompts), self.micro_batch):
            chunk = prompts[start : start + self.micro_batch]
            width = max(len(p) for p in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            attn = torch.zeros((len(chunk), width), dtype=torch.long)
            for b, p in enumerate(chunk):
                ids[b, width - len(p) :] = torch.tensor(p)
                attn[b, width - len(p) :] = 1
            torch.manual_seed(seed + start)
            sampling: dict[str, Any] = (
                {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                if temperature > 0
                else {"do_sample": False}
            )
            with torch.no_grad():
                gen = self.model.generate(
                    input_ids=ids.to(self.device),
                    attention_mask=attn.to(self.device),
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad,
                    eos_token_id=self.eos_ids,
                    **sampling,
                )
            for b, p in enumerate(chunk):
                completion = []
                for tok in gen[b, width:].tolist():
                    completion.append(tok)
                    if tok in self.eos_ids:
                        break
                text = self.tokenizer.decode(completion, skip_special_tokens=True)
                out.append(Decision(list(p), completion, text, parse(text), []))
        with torch.no_grad():
            lp, _ = self.token_logprobs([(d.prompt_ids, d.completion_ids) for d in out], temperature=temperature)
        for b, d in enumerate(out):
            c = len(d.completion_ids)
            d.old_logprobs = [float(x) for x in lp[b, lp.shape[1] - c :]] if c else []
            if len(d.completion_ids) >= max_new_tokens and d.completion_ids[-1] not in self.eos_ids:
                d.extras["truncated"] = True
        return out

    # -- log-probabilities ---------------------------------------------------------------
    def token_logprobs(
        self, pairs: Sequence[tuple[list[int], list[int]]], *, temperature: float = 1.0
    ) -> tuple[Any, Any]:
        """Per-token log-probabilities of each completion after its prompt.

        Returns ([B, C], mask [B, C]) right-aligned: completion b occupies the
        last len(completion_b) columns. Only the completion tokens' positions
        meet the vocabulary (see `_head_logprobs`); a real model's is large.
        """
        torch = self.torch
        rows, masks = [], []
        width_c = max((len(c) for _, c in pairs), default=0)
        for start in range(0, len(pairs), self.micro_batch):
            lp, mask = self._token_logprobs_chunk(pairs[start : start + self.micro_batch], width_c, temperature)
            rows.append(lp)
            masks.append(mask)
        if not rows:
            z = torch.zeros((0, width_c), device=self.device)
            return z, z
        return torch.cat(rows), torch.cat(masks)

    def _token_logprobs_chunk(self, pairs, width_c: int, temperature: float):
        torch = self.torch
        pad = self.tokenizer.pad_token_id
        width = max(len(p) + len(c) for p, c in pairs)
        width = max(width, width_c + 1)
        ids = torch.full((len(pairs), width), pad, dtype=torch.long)
        attn = torch.zeros((len(pairs), width), dtype=torch.long)
        mask = torch.zeros((len(pairs), width_c), dtype=torch.float32)
        for b, (p, c) in enumerate(pairs):
            seq = list(p) + list(c)
            ids[b, width - len(seq) :] = torch.tensor(seq)
            attn[b, width - len(seq) :] = 1
            if c:
                mask[b, width_c - len(c) :] = 1.0
        ids, attn = ids.to(self.device), attn.to(self.device)
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        hidden, _ = self._hidden(input_ids=ids, attention_mask=attn, position_ids=position_ids)
        # Position t predicts token t+1: the completion's tokens are predicted by the C
        # positions before them, and only those (unpadded) rows ever meet the vocabulary.
        mask = mask.to(hidden.device)
        sel = mask.bool()
        targets = ids[:, width - width_c :]
        vals = self._head_logprobs(
            hidden[:, width - width_c - 1 : width - 1][sel], targets[sel].unsqueeze(-1), temperature or 1.0
        ).squeeze(-1)
        lp = torch.zeros(mask.shape, dtype=vals.dtype, device=vals.device).masked_scatter(sel, vals)
        return lp, mask

    def candidate_logprobs(
        self, prompts: Sequence[list[int]], cands: list[list[int]], *, temperature: float = 1.0
    ) -> Any:
        """[D, K]: log-probability of each candidate reply among the K, for each prompt.

        Each prompt is run once, with all K candidates packed after it in the
        same row (`packing`): no copies of the prompt or of its cache.
        """
        torch = self.torch
        step = max(1, self.micro_batch // 2)
        parts = [
            self._candidate_chunk(prompts[start : start + step], cands, temperature or 1.0)
            for start in range(0, len(prompts), step)
        ]
        seq = torch.cat(parts) if parts else torch.zeros((0, len(cands)), device=self.device)
        return torch.log_softmax(seq, dim=-1)

    def _candidate_chunk(self, prompts: Sequence[list[int]], cands: list[list[int]], temperature: float):
        torch = self.torch
        d, k = len(prompts), len(cands)
        decoder, lm_head, _ = self._parts()
        batch = pack(
            torch,
            prompts,
            cands,
            pad=self.tokenizer.pad_token_id,
            config=decoder.config,
            dtype=lm_head.weight.dtype,
            device=self.device,
        )
        hidden, _ = self._hidden(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
        # Every candidate's first token is predicted by the prompt's last position: [D, K].
        head = self._head_logprobs(hidden[:, batch.last_prompt], batch.first_tokens.expand(d, k), temperature)
        r = batch.rest_columns.shape[0]
        if not r:
            return head
        # Each later token by the column before it, inside its own candidate.
        vals = self._head_logprobs(
            hidden[:, batch.rest_columns].reshape(d * r, -1), batch.rest_tokens.repeat(d).unsqueeze(-1), temperature
        ).squeeze(-1)
        rows = (torch.arange(d, device=self.device).unsqueeze(-1) * k + batch.rest_candidate).reshape(-1)
        return head.reshape(-1).index_add(0, rows, vals.to(head.dtype)).view(d, k)

    # -- the model's head, kept away from the vocabulary where it can be -----------------------
    def _parts(self) -> tuple[Any, Any, float | None]:
        """(decoder, output embedding, final logit softcap) of the wrapped causal LM."""
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return base.get_decoder(), base.get_output_embeddings(), getattr(base.config, "final_logit_softcapping", None)

    def _hidden(self, keep: Any = None, **kwargs: Any) -> tuple[Any, Any]:
        """The decoder's last hidden states (after its final norm) and its cache: no logits yet.

        With `keep` ([B, K] positions) only those positions' states, [B, K, H]: where the model
        allows it, its last layer computes nothing else (`last_layer`).
        """
        decoder = self._parts()[0]
        if keep is None:
            out = decoder(**kwargs)
            return out.last_hidden_state, getattr(out, "past_key_values", None)
        with last_layer.only_at(decoder, keep) if keep.shape[1] else contextlib.nullcontext(False) as pruned:
            out = decoder(**kwargs)
        hidden = out.last_hidden_state
        if not pruned:
            hidden = hidden.gather(1, keep.unsqueeze(-1).expand(*keep.shape, hidden.shape[-1]))
        return hidden, getattr(out, "past_key_values", None)

    def _head_logprobs(self, hidden: Any, targets: Any, temperature: float) -> Any:
        """[R, J] log-probabilities of `targets` [R, J] at the positions `hidden` [R, H].

        This is the model's own head (lm_head, softcap, temperature, log-softmax)
        applied a few rows at a time, and under gradient each slice is
        recomputed in the backward pass instead of being kept: memory grows
        with the tokens scored, never with vocabulary x sequence length.
        """
        torch = self.torch
        from torch.utils.checkpoint import checkpoint

        _, lm_head, cap = self._parts()

        def part(h: Any, t: Any) -> Any:
            logits = lm_head(h).float()
            if cap:
                logits = torch.tanh(logits / cap) * cap
            if temperature != 1.0:
                logits = logits / temperature
            return logits.gather(-1, t) - torch.logsumexp(logits, dim=-1, keepdim=True)

        rows = max(1, HEAD_BYTES // (4 * lm_head.weight.shape[0]))
        grad = torch.is_grad_enabled() and hidden.requires_grad
        out = [
            checkpoint(part, hidden[i : i + rows], targets[i : i + rows], use_reentrant=False)
            if grad
            else part(hidden[i : i + rows], targets[i : i + rows])
            for i in range(0, hidden.shape[0], rows)
        ]
        if not out:
            return torch.zeros(targets.shape, device=hidden.device)
        return torch.cat(out)

    def unit_logprobs(self, decisions: Sequence[Decision], *, temperature: float) -> tuple[Any, Any]:
        """What the GRPO loss weighs: [D, T] log-probabilities and mask of the decisions' units.

        Constrained: one unit per decision, the chosen candidate's log-probability
        among the candidates. Free: one unit per generated token.
        """
        torch = self.torch
        if decisions and decisions[0].candidate is not None:
            actions = decisions[0].candidates
            scores = self.candidate_logprobs(
                [d.prompt_ids for d in decisions],
                self.candidate_ids(actions),
                temperature=temperature,
            )
            idx = torch.tensor([d.candidate for d in decisions], device=scores.device)
            lp = scores.gather(-1, idx.unsqueeze(-1))
            return lp, torch.ones_like(lp)
        return self.token_logprobs([(d.prompt_ids, d.completion_ids) for d in decisions], temperature=temperature)
