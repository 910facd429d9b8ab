"""What several neighbouring prefix-tree rows hold, computed once for them as keys and values they attend to.

Prefix-tree rows (`prefix_tree`) compute each shared prefix once per row, so a prefix that
several rows need is computed once in each: in a study-size step every seat's own system
prompt (a few hundred tokens that name the seat) opens each row its conversations span, and
a row that ends inside one seat's conversations holds the next seat's opening again.
Wider rows would repeat less, at an attention mask that grows with the square of the width.

Here neighbouring rows form families, and the trie nodes that two or more rows of a family
hold (an ancestor-closed set: a node's rows all hold its parent) are computed first, in one
pass of their own under gradient (the family's `stem`). Each row then computes only its
other nodes, attending to its ancestors among the stem's through a cache cut from the
stem's keys and values, and takes a stem node's hidden state, where it needs one to score a
token, from the stem's pass. Rows read the stem through detached leaves, so each row's
backward pass stops there and leaves its gradient on them; after the family's last row one
backward pass through the stem takes their sum, as it would if every row had computed the
stem itself. Within a family every node is computed once.

Only for models whose every layer attends fully (a sliding window would crop the cache);
with gradient checkpointing too (the caches here are safe to replay, below). Under
`torch.no_grad` (sampling, the KL reference with the adapter off) rows are computed
whole, as before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dphil.local.prefix_tree import TreeRow

# A family saving fewer positions than this is not worth a pass of its own.
MIN_SHARED = 32


@dataclass
class Family:
    """Neighbouring rows and the nodes two or more of them hold, as a row of their own (`stem`)."""

    rows: range
    stem: TreeRow
    column: dict[int, int]  # trie node -> its column in `stem`


def plan_families(rows: Sequence[TreeRow], *, max_width: int, min_shared: int = MIN_SHARED) -> list[Family]:
    """Runs of neighbouring rows whose shared nodes are computed once, each stem at most `max_width` wide.

    A run grows while the next row holds some node the run already holds and the nodes held
    twice still fit; its stem lives (with its activations) until the run's last row is done,
    so the width bounds memory as it bounds a row's. Rows outside every run are computed whole.
    """
    out: list[Family] = []
    i = 0
    while i < len(rows):
        count = Counter(rows[i].nodes)
        j = i + 1
        while j < len(rows):
            grown = count + Counter(rows[j].nodes)
            shared = sum(c >= 2 for c in grown.values())
            if shared > max_width or not any(n in count for n in rows[j].nodes):
                break
            count = grown
            j += 1
        if j - i > 1 and sum(c - 1 for c in count.values()) >= min_shared:
            out.append(_family(rows, range(i, j), {n for n, c in count.items() if c >= 2}))
        i = j
    return out


def _family(rows: Sequence[TreeRow], span: range, shared: set[int]) -> Family:
    """The shared nodes laid out depth first (each subtree one run of columns, as row_tensors needs).

    The set is ancestor-closed (each row that holds a node holds its parent).
    """
    info: dict[int, tuple[int, int, int]] = {}  # node -> (token, depth, parent node)
    for r in (rows[i] for i in span):
        for c, n in enumerate(r.nodes):
            if n in shared and n not in info:
                p = r.parents[c]
                info[n] = (r.tokens[c], r.depths[c], r.nodes[p] if p >= 0 else -1)
    children: dict[int, list[int]] = {}
    for n in sorted(info):
        children.setdefault(info[n][2], []).append(n)
    order: list[int] = []
    stack = list(reversed(children.get(-1, [])))
    while stack:
        n = stack.pop()
        order.append(n)
        stack.extend(reversed(children.get(n, [])))
    column = {n: c for c, n in enumerate(order)}
    stem = TreeRow(
        tokens=[info[n][0] for n in order],
        depths=[info[n][1] for n in order],
        parents=[column[info[n][2]] if info[n][2] >= 0 else -1 for n in order],
        nodes=order,
    )
    return Family(span, stem, column)


@dataclass
class StemPass:
    """The stem's hidden states and keys and values under gradient, and the leaves rows read."""

    hidden: Any  # [S, H], part of the stem's graph
    states: list[tuple[Any, Any]]  # per layer (keys, values) [1, heads, S, dim]
    hidden_leaf: Any
    leaves: list[tuple[Any, Any]]

    @classmethod
    def of(cls, hidden: Any, states: list[tuple[Any, Any]]) -> StemPass:
        leaves = [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in states]
        return cls(hidden, states, hidden.detach().requires_grad_(True), leaves)

    def cache(self, index: Any) -> Any:
        """The stem columns `index` as a cache one row reads."""
        return read_cache([(k.index_select(2, index), v.index_select(2, index)) for k, v in self.leaves])

    def backward(self, torch: Any) -> None:
        """One backward pass through the stem with the gradient every row left on its leaves."""
        pairs = [(self.hidden, self.hidden_leaf)]
        pairs += [
            (s, leaf)
            for state, kv in zip(self.states, self.leaves, strict=True)
            for s, leaf in zip(state, kv, strict=True)
        ]
        used = [(s, leaf.grad) for s, leaf in pairs if leaf.grad is not None and s.requires_grad]
        if used:
            torch.autograd.backward([s for s, _ in used], [g for _, g in used])


# Caches that a checkpointed layer may replay: transformers drops a layer's cache under
# gradient checkpointing because the usual one appends each call, so the backward pass's
# replay would append twice. These keep nothing a replay could change: one reads the stem
# (a row's keys and values come back after it, none are kept), the other notes each layer's
# keys and values as the stem's pass computes them (a replay notes equal ones again).


def read_cache(stem: list[tuple[Any, Any]]) -> Any:
    """A cache that gives a layer the stem's keys and values followed by its own, and keeps none."""
    import torch
    from transformers import DynamicCache

    class ReadCache(DynamicCache):
        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
            k, v = stem[layer_idx]
            return torch.cat([k, key_states], dim=-2), torch.cat([v, value_states], dim=-2)

    return ReadCache()


def noting_cache() -> Any:
    """A cache that notes each layer's keys and values in `.states` and hands them back alone."""
    from transformers import DynamicCache

    class NotingCache(DynamicCache):
        def __init__(self) -> None:
            super().__init__()
            self.states: dict[int, tuple[Any, Any]] = {}

        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
            self.states[layer_idx] = (key_states, value_states)
            return key_states, value_states

    return NotingCache()


@contextmanager
def replayable(decoder: Any) -> Iterator[None]:
    """Let the decoder's checkpointed layers keep a cache these functions made (see above)."""
    layers = [m for m in decoder.modules() if hasattr(type(m), "_can_checkpoint_with_cache")]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m in layers:
            del m._can_checkpoint_with_cache
