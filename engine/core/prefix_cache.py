"""The prefix cache's index: which device blocks hold which computed content. Torch-free.

A *full* block is named by a hash chain ``hash((parent_hash, tokens))``, the first block's
parent being ``ROOT_HASH``; a block enters the index only after its tokens were computed
(``cache``), so an indexed block's KV is always valid. Beside the hash table, a partial-match
index keys each indexed block by (parent hash, first token): after the full-block matches, the
next tokens of a prompt may match the head of a cached block under the same parent, which the
block manager then copies (copy-on-write) instead of recomputing.

The index only names blocks: ref counts, free lists and tables are the block manager's
(``engine.core.block_manager``), which calls ``evict`` when it hands a cached free block out
for writing. Hash collisions: Python's 64-bit tuple hash, exact on a block's tokens and chained
by the parent's hash; a chain collision is ~2**-64 per lookup. Accepted.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

ROOT_HASH = 0x5EED  # parent hash of a request's first block
_PARTIAL_SCAN = 32  # candidate blocks a partial match compares


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    return hash((parent, tuple(tokens)))


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    def __init__(self, num_blocks: int, block_size: int, enabled: bool = True) -> None:
        self.block_size = block_size
        self.enabled = enabled
        self._hash_of: list[int | None] = [None] * num_blocks
        self._block_of_hash: dict[int, int] = {}
        # Partial-match index: (parent hash, first token) -> hashed blocks with their tokens.
        self._heads: dict[tuple[int, int], dict[int, tuple[int, ...]]] = {}
        self._head_of: dict[int, tuple[int, int]] = {}

    def is_hashed(self, block: int) -> bool:
        return self._hash_of[block] is not None

    def match(
        self, token_ids: Sequence[int]
    ) -> tuple[list[int], list[int], tuple[int, int] | None]:
        """(shared blocks, their hashes, (source block, tokens) of a partial match or None).

        Whole cached blocks, then at most one partial block (the longest head of a cached
        block under the same parent); always fewer than ``len(token_ids)`` tokens: the last
        token is left to compute (its logits are needed).
        """
        blocks: list[int] = []
        hashes: list[int] = []
        if not self.enabled:
            return blocks, hashes, None
        bs = self.block_size
        parent = ROOT_HASH
        for i in range((len(token_ids) - 1) // bs):
            h = block_hash(parent, token_ids[i * bs : (i + 1) * bs])
            block = self._block_of_hash.get(h)
            if block is None:
                break
            blocks.append(block)
            hashes.append(h)
            parent = h
        start = len(blocks) * bs
        tail = token_ids[start : min(len(token_ids) - 1, start + bs)]
        return blocks, hashes, self._partial_match(parent, tail)

    def _partial_match(self, parent: int, tail: Sequence[int]) -> tuple[int, int] | None:
        """The cached block under ``parent`` whose tokens share the longest head with
        ``tail``: (block, shared tokens), or None when none shares a token."""
        if not tail:
            return None
        best: tuple[int, int] | None = None
        bucket = self._heads.get((parent, tail[0]), {})
        # the most recently cached first, at most _PARTIAL_SCAN of them: a bucket under a
        # shared system prompt grows with every conversation
        for block in itertools.islice(reversed(bucket), _PARTIAL_SCAN):
            n = common_prefix_len(bucket[block], tail)
            if best is None or n > best[1]:
                best = (block, n)
                if n == len(tail):
                    break
        return best

    def cache(self, table: Sequence[int], hashes: list[int], token_ids: Sequence[int],
              num_computed_tokens: int) -> None:
        """Index the full, computed blocks of ``table`` past the ``hashes`` already chained
        (appended to). A block whose content is already indexed under another block is left
        unindexed; it is freed as a plain block."""
        bs = self.block_size
        parent = hashes[-1] if hashes else ROOT_HASH
        for i in range(len(hashes), num_computed_tokens // bs):
            tokens = token_ids[i * bs : (i + 1) * bs]
            h = block_hash(parent, tokens)
            block = table[i]
            if h not in self._block_of_hash and self._hash_of[block] is None:
                self._block_of_hash[h] = block
                self._hash_of[block] = h
                head = (parent, tokens[0])
                self._heads.setdefault(head, {})[block] = tuple(tokens)
                self._head_of[block] = head
            hashes.append(h)
            parent = h

    def restore(self, table: Sequence[int], hashes: Sequence[int]) -> None:
        """Index a swapped-in request's full blocks again under their hashes. Not in the
        partial-match index: copies run before swap-ins, so a copy from one of these blocks
        in this step would read it before its KV is back."""
        for i, h in enumerate(hashes):
            if h not in self._block_of_hash:
                self._block_of_hash[h] = table[i]
                self._hash_of[table[i]] = h

    def evict(self, block: int) -> None:
        """Forget an indexed block (the block manager reuses it for other content)."""
        h = self._hash_of[block]
        assert h is not None
        del self._block_of_hash[h]
        self._hash_of[block] = None
        head = self._head_of.pop(block, None)
        if head is not None:
            bucket = self._heads[head]
            del bucket[block]
            if not bucket:
                del self._heads[head]

    def check(self, free_plain: Iterable[int], free_cached: Iterable[int]) -> None:
        """Raise AssertionError on the first broken invariant of the index, given the block
        manager's free lists (plain ones unhashed, cached ones hashed)."""
        for b in free_plain:
            assert self._hash_of[b] is None, f"plain free block {b} has a hash"
        for b in free_cached:
            assert self._hash_of[b] is not None, f"cached free block {b} has no hash"
        for h, b in self._block_of_hash.items():
            assert self._hash_of[b] == h, f"hash table maps to block {b} with another hash"
        for b, head in self._head_of.items():
            assert self._hash_of[b] is not None, f"indexed block {b} has no hash"
            assert b in self._heads[head], f"block {b} missing from its head's bucket"
        hashed = sum(1 for h in self._hash_of if h is not None)
        assert hashed == len(self._block_of_hash), "block hashes and hash table disagree"
