"""Paged KV block manager: which device/CPU blocks hold which request's KV. Torch-free.

The device KV cache is ``num_blocks`` blocks of ``block_size`` token slots. A request owns an
ordered *block table*; token ``i`` of the request lives in block ``table[i // block_size]``,
slot ``i % block_size``::

    request "a", 37 tokens, block_size 16          device pool (ref counts)
    table = [7, 2, 9]                               [0]=0 [1]=0 [2]=1 [3]=0 ...
      tokens  0..15 -> block 7  (full, hashed)      [7]=2  <- shared with "b" (same prefix)
      tokens 16..31 -> block 2  (full, hashed)      [9]=1
      tokens 32..36 -> block 9  (partial: written this step, never shared)

Contract (the scheduler is the only caller; it is not thread-safe):

- ``allocate_slots`` grows a request's table to cover ``num_computed + num_new`` tokens, or
  returns False and changes nothing (then the scheduler preempts).
- Prefix sharing: a *full* block is named by a hash chain ``hash((parent_hash, tokens))``
  (the index: ``engine.core.prefix_cache``). A block enters the hash table only after its tokens were computed (``cache_blocks`` after
  the step), so a cached block's KV is always valid. A new table may start with cached blocks
  (ref count + 1) but always leaves at least the last token to compute, so the block being
  written is never shared. Freed hashed blocks stay in an LRU: they count as free and keep
  their KV until a fresh block is needed (LRU evicted first; unhashed free blocks go before).
- Partial-block reuse (token level): after the full-block matches, the next tokens may match
  the head of a cached full block under the same parent (a prompt that repeats a cached one's
  tail, or the output-filled block of a finished request with the same prompt). That block is
  *copied* into the request's fresh block (copy-on-write: the source stays shared and
  immutable) and its matching tokens count as computed. The copy is pending until the
  scheduler takes it (``take_copies``) for the runner, which runs it after the step's
  swap-outs and before its swap-ins and forward; meanwhile the request cannot swap out (its
  KV is not there yet; the caller falls back to recompute), and freeing it drops the copy.
- Fork (parallel sampling): ``fork`` starts a new table with another request's leading
  blocks, shared by ref count; the new request writes only blocks past them.
- Swap: ``swap_out`` moves a request's KV to the CPU pool (one CPU block per device block) and
  frees the device blocks; ``swap_in`` does the reverse into fresh device blocks. The returned
  copy lists are executed by the runner at the start of the next step: all swap-outs, then the
  partial-block copies, then all swap-ins, then the forward. That order makes it safe to hand a
  device block freed by a swap-out to anyone in the same step. CPU blocks released by a swap-in
  are held back until ``begin_step()`` so that a later swap-out in the same step cannot
  overwrite them before the runner has copied them in.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence

from engine.core.prefix_cache import PrefixCache


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int = 0,
        enable_prefix_caching: bool = True,
    ) -> None:
        if num_blocks < 1 or block_size < 1 or num_cpu_blocks < 0:
            raise ValueError("need num_blocks >= 1, block_size >= 1, num_cpu_blocks >= 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_cpu_blocks = num_cpu_blocks
        self._ref = [0] * num_blocks
        self._prefix = PrefixCache(num_blocks, block_size, enable_prefix_caching)
        # Free device blocks: unhashed ones (reused first) and hashed ones in LRU order.
        self._free_plain: list[int] = list(range(num_blocks - 1, -1, -1))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._copies: dict[str, tuple[int, int]] = {}  # request -> (source, its block): pending
        self._tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[int]] = {}  # chain hashes of a request's computed full blocks
        self._cpu_free: list[int] = list(range(num_cpu_blocks - 1, -1, -1))
        self._cpu_pending: list[int] = []  # released by swap_in this step; see begin_step
        self._cpu_tables: dict[str, list[int]] = {}
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    # ---- counts -------------------------------------------------------------------------
    @property
    def enable_prefix_caching(self) -> bool:
        """Whether computed blocks are named for reuse (the prefix cache owns the flag)."""
        return self._prefix.enabled

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_plain) + len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free)

    @property
    def num_used_cpu_blocks(self) -> int:
        """CPU blocks owned by swapped requests (blocks awaiting ``begin_step`` are not)."""
        return self.num_cpu_blocks - len(self._cpu_free) - len(self._cpu_pending)

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's device block table (empty if it has none). Do not mutate."""
        return self._tables.get(request_id, [])

    def table_covering(self, request_id: str, num_tokens: int) -> list[int] | None:
        """The request's device block table when it already covers ``num_tokens`` tokens
        (a decode token inside the last block: the scheduler's hot path), else None (no
        table, or it must grow: ``allocate_slots``). Do not mutate."""
        table = self._tables.get(request_id)
        if table is None or num_tokens > len(table) * self.block_size:
            return None
        return table

    def num_device_blocks_of(self, request_id: str) -> int:
        return len(self._tables.get(request_id, ()))

    def blocks_freed_by(self, request_ids: Iterable[str]) -> int:
        """How many device blocks freeing every one of ``request_ids`` would free: those
        that no other table holds."""
        drop = Counter(b for rid in request_ids for b in self._tables.get(rid, ()))
        return sum(1 for b, n in drop.items() if self._ref[b] == n)

    def get_cpu_block_ids(self, request_id: str) -> list[int]:
        return list(self._cpu_tables.get(request_id, ()))

    def num_cpu_blocks_of(self, request_id: str) -> int:
        return len(self._cpu_tables.get(request_id, ()))

    def has_blocks(self, request_id: str) -> bool:
        return request_id in self._tables or request_id in self._cpu_tables

    # ---- prefix cache -----------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int]) -> int:
        """Number of leading tokens of ``token_ids`` whose KV is cached. Pure query.

        Whole cached blocks, then at most one partial block (the longest head of a cached
        block under the same parent); always fewer than ``len(token_ids)``: the last token is
        left to compute (its logits are needed).
        """
        blocks, _, partial = self._prefix.match(token_ids)
        return len(blocks) * self.block_size + (partial[1] if partial else 0)

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) device-block copies decided since the last call, for the
        runner (after swap-outs, before swap-ins and the forward)."""
        copies = list(self._copies.values())
        self._copies.clear()
        return copies

    def cache_blocks(self, request_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """Register the request's full, computed blocks in the prefix cache (after a step).

        A block whose hash is already cached (another request computed the same content) is
        left unregistered; it is freed as a plain block.
        """
        if self.enable_prefix_caching:
            self._prefix.cache(self._tables[request_id], self._hashes[request_id], token_ids,
                               num_computed_tokens)

    def num_cached_blocks_of(self, request_id: str) -> int:
        """How many of the request's leading blocks have been hashed (see cache_blocks)."""
        return len(self._hashes.get(request_id, ()))

    # ---- allocation -------------------------------------------------------------------
    def allocate_slots(
        self,
        request_id: str,
        num_new_tokens: int,
        num_computed_tokens: int = 0,
        token_ids: Sequence[int] | None = None,
    ) -> bool:
        """Make the request's table cover ``num_computed_tokens + num_new_tokens`` tokens.

        For a request without a table, ``token_ids`` (its full token list) enables prefix
        reuse: ``num_computed_tokens`` must then equal ``match_prefix(token_ids)``; the whole
        cached blocks are shared instead of allocated and a partial match is copied into the
        first fresh block (pending until ``take_copies``). Returns False, changing nothing,
        when there are not enough free blocks.
        """
        table = self._tables.get(request_id)
        need = -(-(num_computed_tokens + num_new_tokens) // self.block_size)
        if table is not None:
            grow = need - len(table)
            if grow <= 0:
                return True  # the hot path: a decode token inside the last block
            if num_computed_tokens > len(table) * self.block_size:
                raise ValueError(f"request {request_id!r}: {num_computed_tokens} computed "
                                 f"tokens but a table of {len(table)} blocks")
            if grow > self.num_free_blocks:
                return False
            table.extend(self._pop_free() for _ in range(grow))
            return True
        if request_id in self._cpu_tables:
            raise ValueError(f"request {request_id!r} is swapped out; swap_in first")
        shared, hashes, partial = (self._prefix.match(token_ids) if token_ids is not None
                                   else ([], [], None))
        cached = len(shared) * self.block_size + (partial[1] if partial else 0)
        if num_computed_tokens != cached:
            raise ValueError(
                f"num_computed_tokens={num_computed_tokens} for a new table must equal the "
                f"cached prefix ({cached} tokens)"
            )
        # Cached blocks that are currently free are taken out of the free pool too.
        revived = sum(1 for b in shared if self._ref[b] == 0)
        if need - len(shared) > self.num_free_blocks - revived:
            return False
        for b in shared:
            if self._ref[b] == 0:
                del self._free_cached[b]
            self._ref[b] += 1
        new_table = list(shared)
        new_table.extend(self._pop_free() for _ in range(need - len(shared)))
        if partial is not None and partial[0] != new_table[len(shared)]:
            # (a source evicted into this very table keeps its KV until the forward writes it)
            self._copies[request_id] = (partial[0], new_table[len(shared)])
        self._tables[request_id] = new_table
        self._hashes[request_id] = hashes
        if token_ids is not None:
            self.prefix_query_tokens += len(token_ids)
            self.prefix_hit_tokens += num_computed_tokens
        return True

    def fork(self, parent_id: str, child_id: str, num_blocks: int) -> None:
        """Start ``child_id``'s table with the parent's first ``num_blocks`` blocks, shared
        (ref count + 1; parallel sampling). The child grows with ``allocate_slots`` from
        ``num_blocks * block_size`` computed tokens; the blocks it writes are its own."""
        if child_id in self._tables or child_id in self._cpu_tables:
            raise ValueError(f"request {child_id!r} already has blocks")
        if num_blocks == 0:
            return  # no table: the child starts as a new request (prefix match, copy and all)
        shared = self._tables[parent_id][:num_blocks]
        for b in shared:
            self._ref[b] += 1
        self._tables[child_id] = list(shared)
        self._hashes[child_id] = list(self._hashes.get(parent_id, ())[:num_blocks])

    def _pop_free(self) -> int:
        """A fresh block for writing: an unhashed free one, else evict the LRU cached one."""
        if self._free_plain:
            block = self._free_plain.pop()
        else:
            block, _ = self._free_cached.popitem(last=False)
            self._prefix.evict(block)
        self._ref[block] = 1
        return block

    def _release(self, blocks: list[int]) -> None:
        # Reverse order: a request's tail blocks are the least likely to be shared, so they
        # should be evicted first (they enter the LRU as its oldest entries).
        for block in reversed(blocks):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                if not self._prefix.is_hashed(block):
                    self._free_plain.append(block)
                else:
                    self._free_cached[block] = None

    def free(self, request_id: str) -> None:
        """Drop the request's device and CPU blocks (no-op for an unknown id)."""
        table = self._tables.pop(request_id, None)
        if table is not None:
            self._release(table)
        self._hashes.pop(request_id, None)
        self._copies.pop(request_id, None)  # its block may be reused: the copy must not run
        cpu = self._cpu_tables.pop(request_id, None)
        if cpu is not None:
            self._cpu_free.extend(cpu)

    # ---- swapping ---------------------------------------------------------------------
    def swap_out(self, request_id: str) -> list[tuple[int, int]] | None:
        """Move the request's KV to the CPU pool: ``[(device_block, cpu_block), ...]``.

        None (nothing changed) if the CPU pool lacks room, or if the request's partial-block
        copy has not run yet (its KV is not in place to swap). The device blocks are released
        at once (hashed ones stay cached: their content is still valid on the device).
        """
        table = self._tables.get(request_id)
        if table is None:
            raise ValueError(f"request {request_id!r} has no device blocks to swap out")
        if len(table) > len(self._cpu_free) or request_id in self._copies:
            return None
        cpu = [self._cpu_free.pop() for _ in table]
        self._cpu_tables[request_id] = cpu
        mapping = list(zip(table, cpu))
        del self._tables[request_id]
        self._release(table)
        return mapping

    def swap_in(self, request_id: str) -> list[tuple[int, int]] | None:
        """Move the request's KV back into fresh device blocks: ``[(cpu_block, device_block)]``.

        None (nothing changed) if there are not enough free device blocks.
        """
        cpu = self._cpu_tables.get(request_id)
        if cpu is None:
            raise ValueError(f"request {request_id!r} is not swapped out")
        if len(cpu) > self.num_free_blocks:
            return None
        table = [self._pop_free() for _ in cpu]
        del self._cpu_tables[request_id]
        self._cpu_pending.extend(cpu)
        self._tables[request_id] = table
        # Re-register the request's full computed blocks: their KV lands before the forward.
        self._prefix.restore(table, self._hashes.get(request_id, ()))
        return list(zip(cpu, table))

    def begin_step(self) -> None:
        """Start of a schedule(): CPU blocks swapped in last step have been copied; reuse them."""
        if self._cpu_pending:
            self._cpu_free.extend(self._cpu_pending)
            self._cpu_pending.clear()

    # ---- checks -----------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise AssertionError describing the first broken invariant, if any."""
        owners = [0] * self.num_blocks
        for rid, table in self._tables.items():
            assert len(set(table)) == len(table), f"{rid}: duplicate block in table {table}"
            for b in table:
                owners[b] += 1
        free = self._free_plain + list(self._free_cached)
        assert len(set(free)) == len(free), "a device block is on the free lists twice"
        free_set = set(free)
        for b in range(self.num_blocks):
            ref = self._ref[b]
            assert ref >= 0, f"block {b} has negative ref count {ref}"
            assert ref == owners[b], f"block {b}: ref count {ref} != {owners[b]} owners"
            assert (ref == 0) == (b in free_set), f"block {b}: ref {ref} but free={b in free_set}"
        used = sum(1 for r in self._ref if r > 0)
        assert len(free) + used == self.num_blocks, (
            f"device: free {len(free)} + used {used} != {self.num_blocks}"
        )
        self._prefix.check(self._free_plain, self._free_cached)
        for rid, hashes in self._hashes.items():
            if rid in self._tables:
                assert len(hashes) <= len(self._tables[rid]), f"{rid}: more hashes than blocks"
        self._check_cpu()

    def _check_cpu(self) -> None:
        cpu_used = [b for t in self._cpu_tables.values() for b in t]
        everything = self._cpu_free + self._cpu_pending + cpu_used
        assert len(set(everything)) == len(everything), "a CPU block is free and owned, or owned twice"
        assert len(everything) == self.num_cpu_blocks, (
            f"cpu: free {len(self._cpu_free)} + pending {len(self._cpu_pending)} + used "
            f"{len(cpu_used)} != {self.num_cpu_blocks}"
        )
        both = set(self._tables) & set(self._cpu_tables)
        assert not both, f"requests with both device and CPU blocks: {sorted(both)}"
