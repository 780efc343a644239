from __future__ import annotations

import pytest

from engine.core.block_manager import BlockManager


def make_bm(num_blocks: int = 8, block_size: int = 4, num_cpu_blocks: int = 4, **kw: object) -> BlockManager:
    return BlockManager(num_blocks, block_size, num_cpu_blocks, **kw)  # type: ignore[arg-type]


def test_allocate_grows_by_blocks_and_free_returns_them() -> None:
    bm = make_bm()
    assert bm.allocate_slots("a", 5)  # 5 tokens -> 2 blocks
    assert len(bm.get_block_ids("a")) == 2 and bm.num_free_blocks == 6
    assert bm.allocate_slots("a", 3, num_computed_tokens=5)  # 8 tokens: still 2 blocks
    assert len(bm.get_block_ids("a")) == 2
    assert bm.allocate_slots("a", 1, num_computed_tokens=8)  # token 9 opens block 3
    assert len(bm.get_block_ids("a")) == 3 and bm.num_free_blocks == 5
    bm.check_integrity()
    bm.free("a")
    assert bm.num_free_blocks == 8 and bm.get_block_ids("a") == []
    bm.check_integrity()


def test_refusal_leaves_no_partial_allocation() -> None:
    bm = make_bm()
    assert bm.allocate_slots("a", 20)  # 5 blocks
    assert not bm.allocate_slots("b", 13)  # needs 4, 3 free
    assert bm.get_block_ids("b") == [] and bm.num_free_blocks == 3
    assert not bm.allocate_slots("a", 16, num_computed_tokens=20)  # needs 4 more
    assert len(bm.get_block_ids("a")) == 5 and bm.num_free_blocks == 3
    bm.check_integrity()


def test_check_integrity_reports_broken_state() -> None:
    bm = make_bm()
    bm.allocate_slots("a", 4)
    bm._ref[bm.get_block_ids("a")[0]] = 2
    with pytest.raises(AssertionError, match="ref count 2 != 1 owners"):
        bm.check_integrity()
    bm = make_bm()
    bm.allocate_slots("a", 4)
    bm._free_plain.append(bm.get_block_ids("a")[0])
    with pytest.raises(AssertionError, match="twice|free="):
        bm.check_integrity()
    bm = make_bm()
    bm._cpu_free.pop()
    with pytest.raises(AssertionError, match="cpu"):
        bm.check_integrity()


def _computed(bm: BlockManager, rid: str, tokens: list[int]) -> None:
    """Allocate a fresh request with prefix reuse, then mark all its tokens computed."""
    hit = bm.match_prefix(tokens)
    assert bm.allocate_slots(rid, len(tokens) - hit, hit, tokens)
    bm.cache_blocks(rid, tokens, len(tokens))


def test_prefix_blocks_shared_only_after_they_are_computed() -> None:
    bm = make_bm(num_blocks=16)
    prompt = list(range(10))  # 2 full blocks + 2 tokens
    assert bm.allocate_slots("a", 10, 0, prompt)
    assert bm.match_prefix(prompt) == 0  # not computed yet: nothing to share
    bm.cache_blocks("a", prompt, 10)
    assert bm.match_prefix(prompt + [99]) == 8
    assert bm.allocate_slots("b", 3, 8, prompt + [99])
    a, b = bm.get_block_ids("a"), bm.get_block_ids("b")
    assert a[:2] == b[:2] and a[2] != b[2]
    assert [bm._ref[x] for x in a] == [2, 2, 1]
    assert bm.prefix_hit_tokens == 8 and bm.prefix_query_tokens == 10 + 11
    bm.check_integrity()
    bm.free("a")
    assert [bm._ref[x] for x in b] == [1, 1, 1]
    bm.check_integrity()


def test_last_token_is_never_served_from_cache() -> None:
    bm = make_bm(num_blocks=16)
    prompt = list(range(8))  # exactly 2 blocks
    _computed(bm, "a", prompt)
    # the block holding the last token is matched only in part: the last token is computed
    assert bm.match_prefix(prompt) == 7
    assert bm.match_prefix(prompt[:5]) == 4
    assert bm.match_prefix(prompt[:4]) == 3
    assert bm.match_prefix([0, 1, 2, 9, 4, 5, 6, 7, 8]) == 3  # first block differs at its 4th


def test_a_partial_match_copies_the_cached_block_into_a_fresh_one() -> None:
    bm = make_bm(num_blocks=16)
    _computed(bm, "a", list(range(12)))  # blocks [0..3] [4..7] [8..11], all hashed
    prompt = [0, 1, 2, 3, 4, 5, 9, 9, 9]
    assert bm.match_prefix(prompt) == 6  # 1 whole block + 2 tokens of a's second
    assert bm.allocate_slots("b", 3, 6, prompt)
    a, b = bm.get_block_ids("a"), bm.get_block_ids("b")
    assert b[0] == a[0] and b[1] not in a  # shared, then b's own copy
    assert [bm._ref[x] for x in a] == [2, 1, 1]
    assert bm.take_copies() == [(a[1], b[1])]
    assert bm.take_copies() == []  # taken once
    assert bm.prefix_hit_tokens == 6
    bm.check_integrity()


def test_the_longest_cached_head_wins() -> None:
    bm = make_bm(num_blocks=16)
    _computed(bm, "a", [7, 1, 1, 1, 0])
    _computed(bm, "b", [7, 1, 2, 2, 0])
    _computed(bm, "c", [7, 1, 2, 3, 0])
    assert bm.match_prefix([7, 1, 2, 2, 5, 5]) == 4  # b's block, whole
    assert bm.match_prefix([7, 1, 2, 5, 5]) == 3  # b's or c's head
    assert bm.match_prefix([7, 1, 5, 5]) == 2
    assert bm.match_prefix([7, 1, 2, 3]) == 3  # the last token is left to compute
    assert bm.match_prefix([8, 1, 2, 3]) == 0


def test_a_pending_copy_blocks_swap_out_and_dies_with_its_request() -> None:
    bm = make_bm(num_blocks=16)
    _computed(bm, "a", [1, 2, 3, 4, 5])
    assert bm.allocate_slots("b", 2, 3, [1, 2, 3, 9, 9])
    assert bm.swap_out("b") is None  # its KV is not in place until the copy runs
    bm.free("b")
    assert bm.take_copies() == []  # the freed block may go to anyone: no copy into it
    assert bm.allocate_slots("c", 2, 3, [1, 2, 3, 9, 9])
    bm.take_copies()
    assert bm.swap_out("c") is not None  # copied: swaps like any request
    bm.check_integrity()


def test_an_evicted_block_no_longer_matches_in_part() -> None:
    bm = make_bm(num_blocks=2)
    _computed(bm, "a", [1, 2, 3, 4, 5])
    bm.free("a")
    assert bm.match_prefix([1, 2, 9]) == 2
    assert bm.allocate_slots("x", 8)  # both blocks: the cached one is evicted
    assert bm.match_prefix([1, 2, 9]) == 0
    assert not bm._prefix._heads
    bm.check_integrity()


def test_a_source_evicted_into_the_new_table_needs_no_copy() -> None:
    bm = make_bm(num_blocks=1)
    _computed(bm, "a", [1, 2, 3, 4])  # one full block, hashed
    bm.free("a")
    (src,) = [b for b in range(1) if bm._prefix._hash_of[b] is not None]
    assert bm.allocate_slots("b", 1, 3, [1, 2, 3, 8])  # the fresh block is the source itself
    assert bm.get_block_ids("b") == [src] and bm.take_copies() == []
    bm.check_integrity()


def test_a_fork_of_no_blocks_leaves_the_child_a_new_request() -> None:
    """n > 1 with a prompt inside one block: the child gets no table, so its admission
    matches (and copies) like any new request's instead of growing an empty table."""
    bm = make_bm(num_blocks=8)
    _computed(bm, "p", [1, 2, 3, 4])
    bm.fork("p", "c", 0)
    assert not bm.has_blocks("c")
    assert bm.match_prefix([1, 2, 3, 4]) == 3
    assert bm.allocate_slots("c", 1, 3, [1, 2, 3, 4])
    assert bm.take_copies() == [(bm.get_block_ids("p")[0], bm.get_block_ids("c")[0])]
    bm.check_integrity()


def test_growing_a_table_past_its_computed_tokens_is_refused() -> None:
    bm = make_bm(num_blocks=8)
    assert bm.allocate_slots("a", 4)
    with pytest.raises(ValueError, match="computed"):
        bm.allocate_slots("a", 2, num_computed_tokens=7)  # 7 computed, 1 block of 4


def test_blocks_freed_by_counts_only_blocks_no_other_table_holds() -> None:
    bm = make_bm(num_blocks=8, block_size=4)
    assert bm.allocate_slots("p", 12)  # 3 blocks
    bm.fork("p", "c1", 2)
    bm.fork("p", "c2", 2)
    assert bm.allocate_slots("c1", 4, 8) and bm.allocate_slots("c2", 4, 8)  # one own each
    assert bm.blocks_freed_by(["c1"]) == 1  # the shared two stay with p and c2
    assert bm.blocks_freed_by(["c1", "c2"]) == 2
    assert bm.blocks_freed_by(["p", "c1", "c2"]) == 5
    free = bm.num_free_blocks
    for rid in ("p", "c1", "c2"):
        bm.free(rid)
    assert bm.num_free_blocks == free + 5


def test_table_covering_is_the_table_only_while_it_needs_no_block() -> None:
    bm = make_bm(block_size=4)
    assert bm.table_covering("r", 1) is None  # no table yet
    assert bm.allocate_slots("r", 6)  # two blocks: 8 tokens
    table = bm.get_block_ids("r")
    for tokens in range(9):
        assert bm.table_covering("r", tokens) is table
    assert bm.table_covering("r", 9) is None  # the ninth token needs a third block
    assert bm.allocate_slots("r", 1, 8)
    assert bm.table_covering("r", 9) is bm.get_block_ids("r")
