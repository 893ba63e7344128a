"""The unified pool's radix tree of token runs (``kv/unified.py`` keeps its book).

Each node stands for cells that exist once in KV, and every sequence id (``holders``)
tagging a node also tags all its ancestors, so any holder of a node can be the source
of a copy of the whole path. The tree answers where a prompt's cached prefix ends and
cuts a node where a match ends inside it; who holds what, the budget and eviction are
the book's."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from edge_llm.engine.kv.book import common_prefix


class PrefixNode:
    """A run of tokens at positions ``start``.. whose cells exist once in KV."""

    __slots__ = (
        "children", "holders", "last_used", "owner", "parent", "running_refs", "start", "tokens",
    )  # fmt: skip

    def __init__(self, tokens: list[int], start: int, parent: PrefixNode | None) -> None:
        self.tokens = tokens
        self.start = start
        self.parent = parent
        self.children: dict[int, PrefixNode] = {}
        self.holders: set[int] = set()
        self.running_refs = 0
        self.owner: int | None = None  # the running id whose reservation covers these cells
        self.last_used = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def evictable(self) -> bool:
        """No running sequence references it or reserved it."""
        return not self.running_refs and self.owner is None

    def path(self) -> Iterator[PrefixNode]:
        """This node and its ancestors, root excluded."""
        node: PrefixNode | None = self
        while node is not None and node.parent is not None:
            yield node
            node = node.parent


class PrefixTree:
    def __init__(self) -> None:
        self.root = PrefixNode([], 0, None)

    def nodes(self) -> Iterator[PrefixNode]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def evictable(self) -> Iterator[PrefixNode]:
        return (n for n in self.nodes() if n.evictable)

    def lookup(self, tokens: Sequence[int]) -> tuple[PrefixNode, int]:
        """The deepest node sharing a prefix with ``tokens`` and how many of its
        tokens match (the match ends inside it when fewer than all)."""
        node, pos = self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                return node, len(node.tokens)
            common = common_prefix(child.tokens, tokens, pos)
            if common < len(child.tokens):
                return child, common
            node, pos = child, pos + common
        return node, len(node.tokens)

    def attach_point(self, tokens: Sequence[int], matched: int) -> PrefixNode:
        """The node ending exactly at ``matched`` (split if the match ends inside one)."""
        if not matched:
            return self.root
        node, offset = self.lookup(tokens[:matched])
        return node if offset == len(node.tokens) else self._split(node, offset)

    def _split(self, node: PrefixNode, offset: int) -> PrefixNode:
        """Cut ``node`` after ``offset`` tokens; return the upper part."""
        parent = node.parent
        assert parent is not None
        upper = PrefixNode(node.tokens[:offset], node.start, parent)
        upper.holders = set(node.holders)
        upper.running_refs = node.running_refs
        upper.owner = node.owner
        upper.last_used = node.last_used
        parent.children[upper.tokens[0]] = upper
        node.tokens = node.tokens[offset:]
        node.start += offset
        node.parent = upper
        upper.children[node.tokens[0]] = node
        return upper
