"""The terms a constrained choice is scored by: each candidate token once, each head position once.

A candidate's log-probability is the sum of its tokens' log-probabilities, and the choice is
the softmax of those sums over the K candidates. The K replies ("ACTION: think<eos>",
"ACTION: pick_up_left<eos>", ...) share their first tokens, so as a trie they hold about half
the positions they hold one after another; and a term every candidate holds (the same token
predicted from the same position: "ACTION" and ":") adds the same number to every sum, which
the softmax cancels exactly, so it is not computed at all. What remains is scored through the
vocabulary once per predicting position, however many targets it predicts: a position's
logits and their log-sum-exp are the head's whole cost (a 151,936-word vocabulary for Qwen2.5,
as costly per position as a decoder layer).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from dphil.local.prefix_tree import TokenTrie

if TYPE_CHECKING:
    from dphil.local.model import LocalModel

Term = TypeVar("Term", bound=Hashable)


@dataclass(frozen=True)
class CandidateTrie:
    """K candidate replies as a trie placed after a prompt.

    `tokens[j]`, `parent[j]` (-1: the prompt) and `depth[j]` describe node j, parents before
    children; `terms[k]` are candidate k's scored terms as (predicting node, target token),
    node -1 being the prompt's last position, with the terms all K share left out.
    """

    tokens: tuple[int, ...]
    parent: tuple[int, ...]
    depth: tuple[int, ...]
    terms: tuple[tuple[tuple[int, int], ...], ...]

    @classmethod
    def of(cls, cands: Sequence[Sequence[int]]) -> CandidateTrie:
        """The trie of `cands`; each candidate's last token is only a target, never a node."""
        trie = TokenTrie()
        terms = []
        for cand in cands:
            path = trie.insert(cand[:-1])
            # Token j is predicted by node j - 1 (the prompt's last position for the first).
            terms.append(list(zip([-1, *path], cand, strict=True)) if cand else [])
        kept = distinct_terms(terms)
        return cls(tuple(trie.token), tuple(trie.parent), tuple(trie.depth), tuple(tuple(t) for t in kept))

    def sees(self, i: int, j: int) -> bool:
        """Whether node i attends to node j: j is i or one of its ancestors."""
        while i >= 0:
            if i == j:
                return True
            i = self.parent[i]
        return False


def distinct_terms(terms: Sequence[Sequence[Term]]) -> list[list[Term]]:
    """Each candidate's terms less those every candidate holds (their sum's softmax is unchanged).

    A term is hashable and stands for one number: a target token predicted from one position.
    Equal terms within one candidate do not occur (a candidate's positions differ).
    """
    if not terms:
        return []
    held = Counter(t for cand in terms for t in set(cand))
    everyone = {t for t, n in held.items() if n == len(terms)}
    return [[t for t in cand if t not in everyone] for cand in terms]


def term_logprobs(
    lm: LocalModel, hidden: Any, predictors: Sequence[int], targets: Sequence[int], temperature: float
) -> Any:
    """[P]: log-probability of `targets[p]` at `hidden[predictors[p]]`, each position's vocabulary once.

    Pairs that repeat are computed once, and a position predicting several targets passes
    through the head once with all of them (`LocalModel._head_logprobs` takes [R, J] targets).
    """
    torch = lm.torch
    if not predictors:
        return torch.zeros((0,), device=hidden.device)
    rows: dict[int, dict[int, int]] = {}  # predictor -> target -> its column among the row's targets
    for pos, tok in zip(predictors, targets, strict=True):
        row = rows.setdefault(pos, {})
        row.setdefault(tok, len(row))
    order = list(rows)
    width = max(len(r) for r in rows.values())
    padded = [[*r, *([next(iter(r))] * (width - len(r)))] for r in (rows[p] for p in order)]
    out = lm._head_logprobs(
        hidden[torch.tensor(order, device=hidden.device)],
        torch.tensor(padded, device=hidden.device),
        temperature,
    )
    place = {p: i for i, p in enumerate(order)}
    where = [place[p] * width + rows[p][t] for p, t in zip(predictors, targets, strict=True)]
    return out.reshape(-1).index_select(0, torch.tensor(where, device=hidden.device))
