"""DraftTree: the static token tree of tree drafts (vLLM's `speculative_token_tree`, Medusa's "choices").

A tree is a set of paths of ranks. (0,) is the drafter's best guess for the next token, (1,) its second best,
(0, 0) its best guess after (0,), (1, 0) its best after (1,), ... Every prefix of a path is in the tree, and a
node's children have ranks 0, 1, ..., c - 1. Nodes are numbered main chain first (the rank-0 path), then the
others by depth, then by path; the root is the request's last verified token:

    path    (0,)  (0,0)  (0,0,0) | (1,)  (0,1)  (1,0)
    node     0     1      2      |  3     4      5
    parent  -1     0      1      | -1     0      3          -1: the root
    depth    1     2      3      |  1     2      2

A parent comes before its children, so the first m nodes are a tree too: a request verifies the first m nodes
of the tree when it may have only m drafts (max_tokens, the step's budget, the adaptive policy).

The verify step computes the root and the m nodes, root at position P, node i at position P + depth(i) but in the
KV slot of position P + 1 + i; each row attends to the keys up to the root and to its ancestors (`ancestor_bits`,
a TreeMask row). The main chain's node i sits in the slot of its position; a node off the main chain does not.
Each row samples the token after it, keyed by its position (a seeded request's tokens do not depend on the tree);
the accepted path (`walk`) starts at the root and follows the child whose draft equals the row's sample:

    samples    root: s0 = d(0)  ->  node 0: s1 = d(4)  ->  node 4: s2 (no child)     tokens [s0, s1, s2]
    path       [0, 4]: KV of node 4 moves from the slot of P + 5 to that of P + 2 (`moves`)

Exactness: every emitted token is the sample of the row whose context is exactly the tokens emitted before it,
drawn with that position's key, as without drafts (lamina/layers/accept_drafts.py, for one child a node).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["DraftTree", "TreeLevel"]


@dataclass
class TreeLevel:
    """One forward over tree nodes of several rows, grouped by row (a drafter's level, `DraftTree.level`): with the
    root of row r at position root[r], node i sits at position root + depth(i) in the slot of position
    root + 1 + i and sees keys [0, root + 1) and its ancestors (a TreeMask row: ctx, bits)."""

    rows: list[int]  # the rows fed, in order
    row_of: np.ndarray  # [T] each node's index in `rows`
    query_start: np.ndarray  # [len(rows) + 1]
    positions: np.ndarray  # [T]
    slot_positions: np.ndarray  # [T]: the positions whose KV slots the nodes take
    seq_lens: np.ndarray  # [len(rows)]: keys up to each row's last node
    ctx: list[int]
    bits: list[int]


@dataclass(frozen=True)
class DraftTree:
    """The tree of `paths` (validated by lamina.config.SpeculativeConfig) in the order of the module docstring."""

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]

    @classmethod
    def of(cls, paths: Sequence[Sequence[int]]) -> DraftTree:
        chain = sorted((tuple(p) for p in paths if not any(p)), key=len)
        rest = sorted((tuple(p) for p in paths if any(p)), key=lambda p: (len(p), p))
        ordered = tuple(chain + rest)
        index = {path: i for i, path in enumerate(ordered)}
        parents = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in ordered)
        return cls(ordered, parents, tuple(len(p) for p in ordered))

    @property
    def size(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(self.depths)

    def children(self, node: int, m: int) -> list[int]:
        """The children of `node` (-1: the root) among the first m nodes, by rank."""
        return [i for i in range(m) if self.parents[i] == node]

    def levels(self, m: int) -> list[list[int]]:
        """The first m nodes by depth: levels[d - 1] holds the nodes of depth d."""
        out: list[list[int]] = [[] for _ in range(max(self.depths[:m], default=0))]
        for i in range(m):
            out[self.depths[i] - 1].append(i)
        return out

    def ancestors(self, node: int) -> list[int]:
        """The nodes from depth 1 down to `node`, itself included."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def walk(self, samples: Sequence[int], drafts: Sequence[int], m: int) -> list[int]:
        """The accepted path (module docstring): `samples` has the root's row then node i's at 1 + i, `drafts` the
        first m nodes' tokens. Siblings have distinct tokens; should two agree, the lower rank is taken."""
        path, node = [], -1
        while True:
            sample = samples[node + 1]
            nxt = next((c for c in self.children(node, m) if drafts[c] == sample), None)
            if nxt is None:
                return path
            path.append(nxt)
            node = nxt

    def expand(self, parents: Sequence[tuple[int, int]], limits: Sequence[int]
               ) -> tuple[list[list[int]], list[tuple[int, int, int]]]:
        """For parents [(row, node)] (-1: the root): each one's children among the row's first limits[row] nodes,
        and the children that have children themselves as (parent's index, row, child), grouped by row when the
        parents are: the nodes a drafter's next level feeds."""
        kids = [self.children(node, limits[row]) for row, node in parents]
        fed = [(j, row, c) for j, ((row, _), k) in enumerate(zip(parents, kids)) for c in k
               if self.children(c, limits[row])]
        return kids, fed

    def level(self, nodes: Sequence[tuple[int, int]], roots: Sequence[int]) -> TreeLevel:
        """The host inputs of one forward over `nodes` [(row, node)], grouped by row; roots[row]: the position of
        that row's root."""
        rows = list(dict.fromkeys(row for row, _ in nodes))
        counts = [sum(row == r for row, _ in nodes) for r in rows]
        root = np.array([roots[row] for row, _ in nodes], dtype=np.int64)
        node = np.array([i for _, i in nodes], dtype=np.int64)
        last = {row: max(i for r, i in nodes if r == row) for row in rows}
        return TreeLevel(rows, np.repeat(np.arange(len(rows)), counts), np.concatenate(([0], np.cumsum(counts))),
                         root + np.array(self.depths, dtype=np.int64)[node], root + 1 + node,
                         np.array([roots[r] + 2 + last[r] for r in rows], dtype=np.int64), (root + 1).tolist(),
                         [self.ancestor_bits(i) for _, i in nodes])

    def ancestor_bits(self, node: int) -> int:
        """Bit a set for each ancestor a of `node`, itself included: the tree keys its row sees, key a being node a's
        (lamina.attention.metadata.TreeMask, whose ctx then ends at the root)."""
        return sum(1 << a for a in self.ancestors(node))

    def fed_chain(self, m: int) -> int:
        """How many leading main-chain nodes a drafter computes when it drafts the first m nodes (it computes the
        nodes that have children): their KV sits in the slots of their positions."""
        fed = 0
        while fed < m and self.depths[fed] == fed + 1 and self.children(fed, m):
            fed += 1
        return fed

    def moves(self, path: Sequence[int]) -> list[tuple[int, int]]:
        """(from, to) key offsets past the root whose KV an accepted `path` moves: node path[j] was computed in the
        slot 1 + path[j] past the root and belongs in 1 + j (main-chain nodes are in place already)."""
        return [(1 + node, 1 + j) for j, node in enumerate(path) if node != j]
