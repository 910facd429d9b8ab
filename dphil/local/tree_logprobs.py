"""Replies scored on prefix-tree rows (`prefix_tree`): each prefix they share computed once.

Training gets the values of `LocalModel.unit_logprobs` (one unit per constrained decision:
the chosen candidate's log-probability among the K; one per generated token in free
decoding) in the same right-aligned layout, a row at a time: the trainer runs one backward
pass per row, so memory is bounded by a row's width, not by the step. Sampling gets
`candidate_logprobs`' [D, K] for a round's prompts, which share their system prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dphil.local.prefix_tree import TreeRow, plan_rows, row_tensors

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

    @classmethod
    def of_decisions(cls, lm: LocalModel, decisions: Sequence[Decision], *, max_width: int) -> TreeScorer:
        """The replies a step trains on: constrained or free, never both."""
        kinds = {d.candidate is not None for d in decisions}
        if len(kinds) > 1:
            raise ValueError("constrained and free decisions cannot be scored together")
        prompts = [d.prompt_ids for d in decisions]
        if kinds == {True}:
            cands = [lm.candidate_ids(d.candidates) for d in decisions]
            return cls(lm, prompts, candidates=cands, chosen=[d.candidate for d in decisions], max_width=max_width)
        return cls(lm, prompts, completions=[d.completion_ids for d in decisions], max_width=max_width)

    @property
    def tokens(self) -> int:
        """Positions the rows compute (each shared prefix once per row)."""
        return sum(r.width for r in self.rows)

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
        lm = self.lm
        torch = lm.torch
        decoder, lm_head, _ = lm._parts()
        t = row_tensors(torch, row, config=decoder.config, dtype=lm_head.weight.dtype, device=lm.device)
        hidden, _ = lm._hidden(
            input_ids=t.input_ids, attention_mask=t.attention_mask, position_ids=t.position_ids, use_cache=False
        )
        predictors: list[int] = []
        targets: list[int] = []
        spans: list[tuple[int, int, int, int]] = []
        for s, cols in row.columns.items():
            i, k, start = self.owner[s]
            last = self.last[s]
            if last is None:  # an empty reply: nothing to score
                spans.append((i, k, len(targets), 0))
                continue
            # Position t predicts token t + 1: the scored tokens by the columns just before
            # them, the reply's last one by the sequence's last column.
            predictors += cols[start - 1 :]
            targets += [*(row.tokens[c] for c in cols[start:]), last]
            n = len(cols) - start + 1
            spans.append((i, k, len(targets) - n, n))
        flat = lm._head_logprobs(
            hidden[0, predictors], torch.tensor(targets, device=hidden.device).unsqueeze(-1), temperature or 1.0
        ).squeeze(-1)
        return flat, spans


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
