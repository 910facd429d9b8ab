"""Replies scored on prefix-tree rows (`prefix_tree`): each prefix they share computed once.

Training gets the values of `LocalModel.unit_logprobs` (one unit per constrained decision:
the chosen candidate's log-probability among the K; one per generated token in free
decoding) in the same right-aligned layout, a row at a time: the trainer runs one backward
pass per row, so memory is bounded by a row's width, not by the step. With `shared_prefix`
the nodes several neighbouring rows hold are computed once for them (`shared_prefix`), and
the trainer calls `done(row)` after each row's backward pass. Sampling gets
`candidate_logprobs`' [D, K] for a round's prompts, which share their system prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dphil.local.candidate_terms import distinct_terms, term_logprobs
from dphil.local.prefix_tree import TreeRow, plan_rows, row_tensors
from dphil.local.shared_prefix import Family, StemPass, noting_cache, plan_families, replayable

if TYPE_CHECKING:
    from dphil.local.model import Decision, LocalModel


class TreeScorer:
    """The rows of one batch of replies, and their log-probabilities row by row.

    Each item is a prompt with either its K candidate replies (constrained: scored against
    each other) or its one generated completion (free: scored token by token).
    """

    def __init__(
        self,
        lm: LocalModel,
        prompts: Sequence[list[int]],
        *,
        candidates: Sequence[list[list[int]]] | None = None,
        completions: Sequence[list[int]] | None = None,
        chosen: Sequence[int | None] | None = None,
        max_width: int,
        shared_prefix: bool = False,
    ) -> None:
        if (candidates is None) == (completions is None):
            raise ValueError("give every prompt either its candidates or its completion")
        self.lm = lm
        self.constrained = candidates is not None
        self.chosen = list(chosen) if chosen is not None else None
        sequences: list[list[int]] = []
        groups: list[int] = []
        # (item, candidate or -1, where scoring starts) per sequence
        self.owner: list[tuple[int, int, int]] = []
        # A reply's last token is only ever a target: no token after it is scored, so its
        # position is left out of the rows (one per distinct prompt and candidate),
        # unless another sequence goes on through it. Its id is kept here.
        self.last: list[int | None] = []
        for i, prompt in enumerate(prompts):
            tails = candidates[i] if candidates is not None else [completions[i]]  # type: ignore[index]
            for k, tail in enumerate(tails):
                sequences.append([*prompt, *tail[:-1]])
                self.last.append(tail[-1] if tail else None)
                self.owner.append((i, k if self.constrained else -1, len(prompt)))
                groups.append(i)
        self.rows = plan_rows(sequences, groups, max_width=max_width)
        # Under gradient, the nodes several rows of a family hold are computed once (`shared_prefix`).
        self.families: list[Family] = []
        if shared_prefix and lm is not None and can_share(lm):
            self.families = plan_families(self.rows, max_width=max_width)
        self._family_of = {i: f for f in self.families for i in f.rows}
        self._stem: tuple[Family, StemPass] | None = None  # the family whose rows are under way

    @classmethod
    def of_decisions(
        cls, lm: LocalModel, decisions: Sequence[Decision], *, max_width: int, shared_prefix: bool = False
    ) -> TreeScorer:
        """The replies a step trains on: constrained or free, never both."""
        kinds = {d.candidate is not None for d in decisions}
        if len(kinds) > 1:
            raise ValueError("constrained and free decisions cannot be scored together")
        prompts = [d.prompt_ids for d in decisions]
        if kinds == {True}:
            cands = [lm.candidate_ids(d.candidates) for d in decisions]
            chosen = [d.candidate for d in decisions]
            return cls(lm, prompts, candidates=cands, chosen=chosen, max_width=max_width, shared_prefix=shared_prefix)
        completions = [d.completion_ids for d in decisions]
        return cls(lm, prompts, completions=completions, max_width=max_width, shared_prefix=shared_prefix)

    @property
    def tokens(self) -> int:
        """Positions the rows compute: each shared prefix once per row, once per family with a stem."""
        total = sum(r.width for i, r in enumerate(self.rows) if i not in self._family_of)
        for f in self.families:
            total += f.stem.width + sum(n not in f.column for i in f.rows for n in self.rows[i].nodes)
        return total

    def done(self, row: TreeRow) -> None:
        """After the row's backward pass; after a family's last row, the stem's own backward pass.

        The trainer calls it once per row, in order. The stem's gradient is the sum of what
        the family's rows left on its leaves.
        """
        i = self._index(row)
        family = self._family_of.get(i)
        if self._stem is not None and family is self._stem[0] and i == family.rows[-1]:
            self._stem[1].backward(self.lm.torch)
            self._stem = None

    def unit_logprobs(self, row: TreeRow, *, temperature: float) -> tuple[list[int], Any, Any]:
        """(the row's items, [D, T] log-probabilities, [D, T] mask), as `unit_logprobs` lays them out."""
        torch = self.lm.torch
        if self.constrained:
            if self.chosen is None:
                raise ValueError("units of constrained replies need the chosen candidates")
            idx, scores = self.candidate_scores(row, temperature=temperature)
            chosen = torch.tensor([self.chosen[i] for i in idx], device=scores.device)
            lp = scores.gather(-1, chosen.unsqueeze(-1))
            return idx, lp, torch.ones_like(lp)
        flat, spans = self._scored(row, temperature)
        index = {d: j for j, d in enumerate(row.groups)}
        width = max((n for *_, n in spans), default=0)
        lp = torch.zeros((len(row.groups), width), dtype=flat.dtype, device=flat.device)
        mask = torch.zeros((len(row.groups), width), dtype=torch.float32, device=flat.device)
        for i, _, first, n in spans:
            if n:
                lp[index[i], width - n :] = flat[first : first + n]
                mask[index[i], width - n :] = 1.0
        return list(row.groups), lp, mask

    def candidate_scores(self, row: TreeRow, *, temperature: float) -> tuple[list[int], Any]:
        """(the row's items, [D, K]): each candidate's log-probability among its prompt's K."""
        torch = self.lm.torch
        flat, spans = self._scored(row, temperature)
        index = {d: j for j, d in enumerate(row.groups)}
        k_count = max(k for _, k, _, _ in spans) + 1
        seq = torch.zeros((len(row.groups) * k_count,), dtype=flat.dtype, device=flat.device)
        which = torch.tensor([(index[i] * k_count + k) for i, k, _, n in spans for _ in range(n)], device=flat.device)
        scores = torch.log_softmax(seq.index_add(0, which, flat).view(len(row.groups), k_count), dim=-1)
        return list(row.groups), scores

    def _scored(self, row: TreeRow, temperature: float) -> tuple[Any, list[tuple[int, int, int, int]]]:
        """The row's forward pass: every scored token's log-probability, and (item, candidate, first, count) spans."""
        torch = self.lm.torch
        family = self._family_of.get(self._index(row)) if torch.is_grad_enabled() else None
        # Each sequence's terms: (the column predicting a token, the token).
        seqs: list[tuple[int, int, list[tuple[int, int]]]] = []
        for s, cols in row.columns.items():
            i, k, start = self.owner[s]
            last = self.last[s]
            if last is None:  # an empty reply: nothing to score
                seqs.append((i, k, []))
                continue
            # Position t predicts token t + 1: the scored tokens by the columns just before
            # them, the reply's last one by the sequence's last column.
            preds = cols[start - 1 :]
            seqs.append((i, k, list(zip(preds, [*(row.tokens[c] for c in cols[start:]), last], strict=True))))
        if self.constrained:  # a term all of an item's candidates hold cancels in their softmax
            items: dict[int, list[int]] = {}
            for j, (i, _, _) in enumerate(seqs):
                items.setdefault(i, []).append(j)
            for js in items.values():
                for j, kept in zip(js, distinct_terms([seqs[j][2] for j in js]), strict=True):
                    seqs[j] = (seqs[j][0], seqs[j][1], kept)
        # Only the columns that predict a scored token are read (`last_layer`).
        readers = sorted({c for _, _, terms in seqs for c, _ in terms})
        hidden, at = self._whole(row, readers) if family is None else self._hidden(row, family, readers)
        predictors: list[int] = []
        targets: list[int] = []
        spans: list[tuple[int, int, int, int]] = []
        for i, k, terms in seqs:
            spans.append((i, k, len(targets), len(terms)))
            predictors += [at[c] for c, _ in terms]
            targets += [t for _, t in terms]
        flat = term_logprobs(self.lm, hidden, predictors, targets, temperature or 1.0)
        return flat, spans

    def _whole(self, row: TreeRow, readers: list[int]) -> tuple[Any, dict[int, int]]:
        """The hidden states of the row's `readers` columns, every column computed, and each one's place."""
        lm = self.lm
        decoder, lm_head, _ = lm._parts()
        t = row_tensors(lm.torch, row, config=decoder.config, dtype=lm_head.weight.dtype, device=lm.device)
        hidden, _ = lm._hidden(
            keep=lm.torch.tensor([readers], dtype=lm.torch.long, device=lm.device),
            input_ids=t.input_ids,
            attention_mask=t.attention_mask,
            position_ids=t.position_ids,
            use_cache=False,
        )
        return hidden[0], {c: j for j, c in enumerate(readers)}

    def _index(self, row: TreeRow) -> int:
        return next(i for i, r in enumerate(self.rows) if r is row)

    def _hidden(self, row: TreeRow, family: Family, readers: list[int]) -> tuple[Any, dict[int, int]]:
        """The hidden states of the row's `readers` columns, and each one's place in them.

        The row computes the columns its family's stem lacks, attending to the stem's columns
        it holds through a cache; a stem column's hidden state is the stem's (through its leaf).
        """
        lm = self.lm
        torch = lm.torch
        decoder, lm_head, _ = lm._parts()
        stem = self._stem_pass(family)
        held = family.column
        wanted = set(readers)
        cached = [c for c, n in enumerate(row.nodes) if n in held]
        own = [c for c, n in enumerate(row.nodes) if n not in held]
        own_read = [j for j, c in enumerate(own) if c in wanted]  # places among the row's own columns
        cached_read = [c for c in cached if c in wanted]
        read = torch.tensor([held[row.nodes[c]] for c in cached_read], dtype=torch.long, device=lm.device)
        from_stem = stem.hidden_leaf.index_select(0, read)
        at = {own[j]: i for i, j in enumerate(own_read)} | {c: len(own_read) + i for i, c in enumerate(cached_read)}
        if not own:  # every column is the stem's
            return from_stem, at
        index = torch.tensor([held[row.nodes[c]] for c in cached], dtype=torch.long, device=lm.device)
        t = row_tensors(torch, row, config=decoder.config, dtype=lm_head.weight.dtype, device=lm.device, cached=cached)
        with replayable(decoder):
            hidden, _ = lm._hidden(
                keep=torch.tensor([own_read], dtype=torch.long, device=lm.device),
                input_ids=t.input_ids,
                attention_mask=t.attention_mask,
                position_ids=t.position_ids,
                past_key_values=stem.cache(index),
                use_cache=True,
            )
        return torch.cat([hidden[0], from_stem]), at

    def _stem_pass(self, family: Family) -> StemPass:
        """The family's stem under gradient, computed for its first row and kept for the rest."""
        if self._stem is not None and self._stem[0] is family:
            return self._stem[1]
        if self._stem is not None:
            raise RuntimeError("each row of a family with a shared stem must be followed by done(row), in order")
        lm = self.lm
        decoder, lm_head, _ = lm._parts()
        t = row_tensors(lm.torch, family.stem, config=decoder.config, dtype=lm_head.weight.dtype, device=lm.device)
        cache = noting_cache()
        with replayable(decoder):
            hidden, _ = lm._hidden(
                input_ids=t.input_ids,
                attention_mask=t.attention_mask,
                position_ids=t.position_ids,
                past_key_values=cache,
                use_cache=True,
            )
        self._stem = (family, StemPass.of(hidden[0], [cache.states[i] for i in range(len(cache.states))]))
        return self._stem[1]


def can_share(lm: LocalModel) -> bool:
    """Whether rows may attend to a stem's cache: every layer attends fully (a sliding window would crop it)."""
    kinds = getattr(lm._parts()[0].config, "layer_types", None) or ["full_attention"]
    return all(kind == "full_attention" for kind in kinds)


def tree_candidate_logprobs(
    lm: LocalModel, prompts: Sequence[list[int]], cands: list[list[int]], *, temperature: float, max_width: int
) -> Any:
    """[D, K] as `LocalModel.candidate_logprobs` gives it, each shared prefix computed once per row."""
    torch = lm.torch
    scorer = TreeScorer(lm, prompts, candidates=[cands] * len(prompts), max_width=max_width)
    out = torch.zeros((len(prompts), len(cands)), device=lm.device)
    for row in scorer.rows:
        idx, scores = scorer.candidate_scores(row, temperature=temperature)
        out[idx] = scores.to(out.dtype)
    return out
