"""Many token sequences that share prefixes, packed so that every shared prefix is computed once.

A training step scores hundreds of replies whose prompts overlap: every philosopher's
conversation opens with nearly the same system prompt, with `--memory full` each turn's
prompt is the previous turn's prompt and reply plus one observation, and constrained
decoding puts K candidate replies after each prompt. Scored one prompt at a time, the
shared tokens are computed again for every reply (at N = 5 and 5 rounds, four times over).

Here the sequences go into a token trie. A row of the batch holds whole sequences and the
union of their trie nodes, each node once, in depth-first order; a node attends to its
ancestors and itself, at its depth as position. Every token's hidden state is then the one
a separate forward pass over its own sequence computes (the same keys at the same
positions), and under gradient a shared prefix collects the sum of its dependents'
gradients, as separate passes would sum them. Rows hold at most `max_width` nodes (a
group larger than that gets a row of its own): attention over a row costs its width
squared, so a very wide row would spend more on masked-out pairs than sharing saves.

Planning is plain Python; `row_tensors` builds the torch inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dphil.local.packing import layer_masks


@dataclass
class TreeRow:
    """One row: its nodes in depth-first order and where each of its sequences' tokens sit."""

    tokens: list[int]
    depths: list[int]
    parents: list[int]  # column of each node's parent in this row; -1 for a root
    groups: list[int] = field(default_factory=list)  # the groups (callers' units) this row holds
    columns: dict[int, list[int]] = field(default_factory=dict)  # sequence index -> its tokens' columns
    nodes: list[int] = field(default_factory=list)  # each column's trie node (the same node in every row)

    @property
    def width(self) -> int:
        return len(self.tokens)


class TokenTrie:
    """Token trie: node ids in insertion order, each with its token, parent and depth."""

    def __init__(self) -> None:
        self.token: list[int] = []
        self.parent: list[int] = []
        self.depth: list[int] = []
        self.children: list[dict[int, int]] = []
        self.roots: dict[int, int] = {}

    def insert(self, seq: Sequence[int]) -> list[int]:
        path: list[int] = []
        level, parent = self.roots, -1
        for tok in seq:
            node = level.get(tok)
            if node is None:
                node = len(self.token)
                level[tok] = node
                self.token.append(tok)
                self.parent.append(parent)
                self.depth.append(len(path))
                self.children.append({})
            path.append(node)
            level, parent = self.children[node], node
        return path

    def preorder(self) -> list[int]:
        """Each node's rank in a depth-first walk (children in insertion order)."""
        rank = [0] * len(self.token)
        stack = list(reversed(self.roots.values()))
        i = 0
        while stack:
            node = stack.pop()
            rank[node] = i
            i += 1
            stack.extend(reversed(self.children[node].values()))
        return rank


def plan_rows(sequences: Sequence[Sequence[int]], groups: Sequence[int], *, max_width: int) -> list[TreeRow]:
    """Rows holding every sequence once; the sequences of one group always share a row.

    `groups[i]` names sequence i's group (a decision with its K candidates is one group, so
    its candidates can be normalised against each other). Groups are placed in depth-first
    order of their first sequence, so neighbours in a row share the longest prefixes.
    """
    if len(sequences) != len(groups):
        raise ValueError("one group per sequence")
    if any(not s for s in sequences):
        raise ValueError("every sequence needs at least one token")
    trie = TokenTrie()
    paths = [trie.insert(s) for s in sequences]
    rank = trie.preorder()
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    order = sorted(members, key=lambda g: rank[paths[members[g][0]][-1]])
    rows: list[TreeRow] = []
    nodes: set[int] = set()
    held: list[int] = []
    for g in order:
        new = {n for i in members[g] for n in paths[i]} - nodes
        if held and len(nodes) + len(new) > max_width:
            rows.append(_row(trie, rank, nodes, held, members, paths))
            nodes, held = set(), []
            new = {n for i in members[g] for n in paths[i]}
        nodes |= new
        held.append(g)
    if held:
        rows.append(_row(trie, rank, nodes, held, members, paths))
    return rows


def _row(trie: TokenTrie, rank: list[int], nodes: set[int], held: list[int], members, paths) -> TreeRow:
    ordered = sorted(nodes, key=rank.__getitem__)
    column = {n: c for c, n in enumerate(ordered)}
    row = TreeRow(
        tokens=[trie.token[n] for n in ordered],
        depths=[trie.depth[n] for n in ordered],
        parents=[column[trie.parent[n]] if trie.parent[n] >= 0 else -1 for n in ordered],
        groups=list(held),
        nodes=ordered,
    )
    for g in held:
        for i in members[g]:
            row.columns[i] = [column[n] for n in paths[i]]
    return row


@dataclass
class RowTensors:
    """A row as the decoder takes it: ids and positions [1, W] and its attention masks."""

    input_ids: Any
    position_ids: Any
    attention_mask: Any  # a 4D additive mask [1, 1, W, W], or {layer type: mask}


def row_tensors(
    torch: Any, row: TreeRow, *, config: Any, dtype: Any, device: Any, cached: Sequence[int] = ()
) -> RowTensors:
    """Ancestor-or-self attention over the row's depth-first layout.

    In depth-first order a node's subtree is one run of columns, from itself to its last
    descendant (`last`): column j is an ancestor of column i exactly when j <= i <= last[j].
    The `cached` columns' keys and values come from a cache (`shared_prefix`): the ids and
    positions are then the other columns' [1, Q], the mask [1, 1, Q, W] theirs over the
    cached columns (in the cache's order) and themselves.
    """
    w = row.width
    last = list(range(w))
    for c in range(w - 1, -1, -1):
        p = row.parents[c]
        if p >= 0 and last[c] > last[p]:
            last[p] = last[c]
    cols = torch.arange(w)
    last_t = torch.tensor(last)
    allowed = (cols[None, :] <= cols[:, None]) & (cols[:, None] <= last_t[None, :])
    depth = torch.tensor(row.depths, dtype=torch.long)
    queries = list(range(w))
    if cached:
        held = set(cached)
        queries = [c for c in range(w) if c not in held]
        keys = torch.tensor([*cached, *queries])
        allowed, depth = allowed[queries][:, keys], depth[keys]
    masks = layer_masks(torch, allowed[None], depth[None], config, dtype)
    return RowTensors(
        input_ids=torch.tensor([[row.tokens[c] for c in queries]], dtype=torch.long, device=device),
        position_ids=depth[None, len(cached) :].to(device),
        attention_mask={k: m.to(device) for k, m in masks.items()} if isinstance(masks, dict) else masks.to(device),
    )
