"""Paged attention over a flattened, ragged batch: Triton kernel and torch reference.

Request r owns query rows ``query_start_loc[r]:query_start_loc[r+1]`` of ``q`` and has
``seq_lens[r]`` tokens of context in the cache (including its new tokens, already written).
Its query token i sits at position ``seq_lens[r] - q_len + i`` and attends causally.

The Triton kernel is one kernel for prefill chunks and decode. Grid: (query blocks, KV heads,
KV splits). A query block is up to BLOCK_Q tokens of one request times all the query heads
that share one KV head, so each K/V tile is loaded once per GQA group and both products are
``tl.dot`` on tensor cores (rows padded to >= 16). Programs find their request by binary
search over ``query_start_loc``, so the launch needs no host sync. When few programs would be
busy (small decode batches, long contexts) the keys are split across programs
(flash-decoding) and a second kernel merges the partial softmaxes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.checks import (
    INDEX_DTYPES,
    check_contiguous,
    check_last_dim_contiguous,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
)

_LOG2E = math.log2(math.e)
# (q [R, Hq, D], k_cache, v_cache, block_tables [R, M], seq_lens [R], scale) -> [R, Hq, D]
DecodeFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    decode_fn: DecodeFn | None = None,
) -> torch.Tensor:
    """q: [T, Hq, D]; caches: [N, B, Hk, D]; block_tables: [R, max_blocks] int32;
    seq_lens: [R]; query_start_loc: [R+1]. Returns [T, Hq, D]. ``decode_fn`` computes the
    one-token rows (same arguments as ``_decode_batched``, the default): the CPU op that reads
    blocks in place (``kernels.cpu_decode``) plugs in here."""
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    q_lens = [starts[r + 1] - starts[r] for r in range(len(lens))]
    # Decode rows (one query token) go through one batched gather + matmul: a per-request
    # loop costs ~30 small kernels per layer per request on CPU.
    decode = [r for r, n in enumerate(q_lens) if n == 1]
    if len(decode) == len(lens) == q.shape[0]:  # a pure decode step: no row gather/scatter
        return (decode_fn or _decode_batched)(q, k_cache, v_cache, block_tables, seq_lens, scale)
    if decode:
        rows = torch.tensor(decode, dtype=torch.long, device=q.device)
        token_rows = query_start_loc.long()[rows]
        out[token_rows] = (decode_fn or _decode_batched)(
            q[token_rows], k_cache, v_cache, block_tables[rows], seq_lens[rows], scale
        )
    for r, ctx in enumerate(lens):
        if q_lens[r] > 1:
            s, e = starts[r], starts[r + 1]
            out[s:e] = _attend_one(q[s:e], k_cache, v_cache, block_tables[r], ctx, scale)
    return out


def _gather(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """[..., nb] block ids -> [..., length, Hk, D] tokens."""
    g = cache[blocks]
    return g.reshape(*blocks.shape[:-1], -1, *cache.shape[2:])[..., :length, :, :]


def _attend_one(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
    ctx: int, scale: float,
) -> torch.Tensor:
    """One request's q_len query tokens (the last q_len positions of ctx), causal."""
    q_len, num_heads = q.shape[0], q.shape[1]
    group = num_heads // k_cache.shape[2]
    nb = (ctx + k_cache.shape[1] - 1) // k_cache.shape[1]
    blocks = table[:nb].long()
    k, v = _gather(k_cache, blocks, ctx), _gather(v_cache, blocks, ctx)
    # [H, q_len, D] x [H, ctx, D]; GQA by repeating KV heads
    qh = q.transpose(0, 1)
    kh = k.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)
    vh = v.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)
    # query i (position ctx - q_len + i) sees keys 0..ctx - q_len + i
    qpos = torch.arange(ctx - q_len, ctx, device=q.device).unsqueeze(1)
    mask = torch.arange(ctx, device=q.device).unsqueeze(0) <= qpos
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return o.transpose(0, 1)


def _decode_batched(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
    ctx: torch.Tensor, scale: float,
) -> torch.Tensor:
    """R decode queries [R, Hq, D], each attending to its own ctx[r] cached tokens.

    One gather of whole KV blocks through the block tables (12 KB copies rather than one per
    token slot; the tail of the last block is masked), then one fused SDPA call over strided
    head views with GQA: no permute copies, no repeated KV heads, and one parallel region per
    layer instead of a matmul/softmax chain per KV head."""
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    num_blocks = (int(ctx.max()) + block_size - 1) // block_size
    length = num_blocks * block_size
    blocks = tables[:, :num_blocks].long()  # [R, nb]; padding entries are masked below
    shape = (num_rows, length, num_kv_heads, head_dim)
    k = F.embedding(blocks, k_cache.reshape(k_cache.shape[0], -1)).view(shape)
    v = F.embedding(blocks, v_cache.reshape(v_cache.shape[0], -1)).view(shape)
    k, v = k.transpose(1, 2).to(q.dtype), v.transpose(1, 2).to(q.dtype)
    pos = torch.arange(length, device=q.device)
    keep = (pos < ctx.to(q.device).unsqueeze(1)).view(num_rows, 1, 1, length)
    out = F.scaled_dot_product_attention(
        q.view(num_rows, num_heads, 1, head_dim), k, v, attn_mask=keep, scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )
    return out.view(num_rows, num_heads, head_dim)


@triton.jit
def _find_request(qsl_ptr, pid, n_requests, BLOCK_Q: tl.constexpr):
    """Largest r with qsl[r] // BLOCK_Q + r <= pid: the request whose query blocks hold pid.
    Request r's blocks start at qsl[r] // BLOCK_Q + r, which leaves room for its
    cdiv(q_len, BLOCK_Q) blocks, so the grid bound T // BLOCK_Q + R needs no host sync."""
    # Scalar tensors, not Python ints: n_requests == 1 is specialised to a constexpr, and a
    # loop-carried value must keep one type.
    lo = tl.full([], 0, tl.int32)
    hi = tl.full([], 0, tl.int32) + n_requests
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(qsl_ptr + mid)
        if start // BLOCK_Q + mid <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_tiles(
    q, kc_ptr, vc_ptr, bt_row, kvh, q_pos, kv_len, t_begin, t_end, scale_log2e,
    stride_cblock, stride_cslot, stride_chead, head_dim, block_size, max_blocks,
    BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, TILE_N: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """Online softmax of q [BLOCK_M, D] over key tiles [t_begin, t_end) of one request, read
    through its block table row. Returns the running max (base 2), sum and unnormalised
    output."""
    d = tl.arange(0, D_PAD)
    d_ok = d < head_dim
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for t in range(t_begin, t_end):
        n = t * TILE_N + tl.arange(0, TILE_N)
        n_ok = (n < kv_len) & (n // block_size < max_blocks)
        blk = tl.load(bt_row + n // block_size, mask=n_ok, other=0).to(tl.int64)
        kv_off = blk * stride_cblock + (n % block_size) * stride_cslot + kvh * stride_chead
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(kc_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(vc_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if DOT_FP32:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        visible = (n[None, :] <= q_pos[:, None]) & n_ok[None, :]
        s = tl.where(visible, s * scale_log2e, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT_FP32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _paged_attention_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, out_ptr,
    part_acc_ptr, part_m_ptr, part_l_ptr,
    scale_log2e, n_requests, n_tokens, n_q_heads,
    stride_qt, stride_qh, stride_bt, stride_cblock, stride_cslot, stride_chead,
    head_dim, block_size, max_blocks, group,
    BLOCK_Q: tl.constexpr, G_PAD: tl.constexpr, D_PAD: tl.constexpr, TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """One program = one query block (BLOCK_Q tokens x all G query heads of one KV head, so
    each K/V tile is read once per group) x one KV split. Online softmax in base 2."""
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    r = _find_request(qsl_ptr, pid, n_requests, BLOCK_Q)
    q_start = tl.load(qsl_ptr + r).to(tl.int32)
    q_len = tl.load(qsl_ptr + r + 1).to(tl.int32) - q_start
    qb = pid - (q_start // BLOCK_Q + r)
    if qb * BLOCK_Q >= q_len:
        return
    ctx = tl.load(seq_lens_ptr + r).to(tl.int32)

    rows = tl.arange(0, BLOCK_Q * G_PAD)
    tok = qb * BLOCK_Q + rows // G_PAD
    head = kvh * group + rows % G_PAD
    row_ok = (tok < q_len) & (rows % G_PAD < group) & (q_start + tok < n_tokens)
    q_pos = ctx - q_len + tok
    d = tl.arange(0, D_PAD)
    d_ok = d < head_dim
    q_row = (q_start + tok).to(tl.int64)
    q_off = q_row[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    # Keys this block can see end at its last query's position (causal).
    kv_len = ctx - q_len + tl.minimum((qb + 1) * BLOCK_Q, q_len)
    n_tiles = tl.cdiv(kv_len, TILE_N)
    per_split = tl.cdiv(n_tiles, NUM_SPLITS)
    t_begin = split * per_split
    t_end = tl.minimum(t_begin + per_split, n_tiles)

    m_i, l_i, acc = _attend_tiles(
        q, kc_ptr, vc_ptr, bt_ptr + r.to(tl.int64) * stride_bt, kvh, q_pos, kv_len,
        t_begin, t_end, scale_log2e, stride_cblock, stride_cslot, stride_chead, head_dim,
        block_size, max_blocks, BLOCK_Q * G_PAD, D_PAD, TILE_N, DOT_FP32,
    )
    mask = row_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        out_off = q_row[:, None] * n_q_heads * head_dim + head[:, None] * head_dim + d[None, :]
        tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        # Unnormalised partials; _combine_splits_kernel merges them.
        ml_off = (split * n_tokens + q_row) * n_q_heads + head
        tl.store(part_m_ptr + ml_off, m_i, mask=row_ok)
        tl.store(part_l_ptr + ml_off, l_i, mask=row_ok)
        tl.store(part_acc_ptr + ml_off[:, None] * head_dim + d[None, :], acc, mask=mask)


@triton.jit
def _combine_splits_kernel(
    part_acc_ptr, part_m_ptr, part_l_ptr, out_ptr, n_tokens, n_q_heads, head_dim,
    NUM_SPLITS: tl.constexpr, S_PAD: tl.constexpr, D_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D_PAD)
    ml_off = (s * n_tokens + tok) * n_q_heads + head
    # part_l is zero-filled: splits (or tokens) no program wrote contribute nothing.
    l_s = tl.load(part_l_ptr + ml_off, mask=s < NUM_SPLITS, other=0.0)
    used = l_s > 0
    m_s = tl.load(part_m_ptr + ml_off, mask=used, other=-1.0e30)
    w = tl.where(used, tl.exp2(m_s - tl.max(m_s, axis=0)), 0.0)
    acc_mask = used[:, None] & (d[None, :] < head_dim)
    acc = tl.load(part_acc_ptr + ml_off[:, None] * head_dim + d[None, :], mask=acc_mask,
                  other=0.0)
    denom = tl.sum(l_s * w, axis=0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(denom > 0, denom, 1.0)
    out_off = (tok * n_q_heads + head) * head_dim + d
    tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=d < head_dim)


def _validate(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
) -> None:
    name = "paged_attention"
    check_tensor(f"{name}: q", q, 3)
    check_tensor(f"{name}: k_cache", k_cache, 4)
    check_tensor(f"{name}: v_cache", v_cache, 4)
    check_tensor(f"{name}: block_tables", block_tables, 2, INDEX_DTYPES)
    check_tensor(f"{name}: seq_lens", seq_lens, 1, INDEX_DTYPES)
    check_tensor(f"{name}: query_start_loc", query_start_loc, 1, INDEX_DTYPES)
    check_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                      seq_lens=seq_lens, query_start_loc=query_start_loc)
    check_same_dtype(q=q, k_cache=k_cache, v_cache=v_cache)
    check_shape(f"{name}: v_cache", v_cache, k_cache.shape)
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"{name}: q head_dim {head_dim} != cache head_dim {k_cache.shape[3]}")
    if n_kv_heads == 0 or n_heads % n_kv_heads:
        raise ValueError(f"{name}: {n_heads} query heads are not a multiple of {n_kv_heads} KV heads")
    n_requests = block_tables.shape[0]
    check_shape(f"{name}: seq_lens", seq_lens, (n_requests,))
    check_shape(f"{name}: query_start_loc", query_start_loc, (n_requests + 1,))
    check_contiguous(f"{name}: k_cache", k_cache)
    check_contiguous(f"{name}: v_cache", v_cache)
    check_contiguous(f"{name}: seq_lens", seq_lens)
    check_contiguous(f"{name}: query_start_loc", query_start_loc)
    check_last_dim_contiguous(f"{name}: q", q)
    check_last_dim_contiguous(f"{name}: block_tables", block_tables)
    if not q.is_cuda:
        # Cheap on the host (and an out-of-bounds read segfaults the interpreter); on a GPU
        # these checks would cost a device sync per layer, so the kernel masks instead.
        _validate_values(q.shape[0], k_cache.shape[0], k_cache.shape[1], block_tables, seq_lens,
                         query_start_loc)


def _validate_values(
    n_tokens: int, n_blocks: int, block_size: int, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
) -> None:
    name = "paged_attention"
    qsl = query_start_loc.long()
    q_lens = qsl[1:] - qsl[:-1]
    if int(qsl[0]) != 0 or bool((q_lens < 0).any()) or int(qsl[-1]) > n_tokens:
        raise ValueError(f"{name}: query_start_loc must rise from 0 to at most {n_tokens}, "
                         f"got {qsl.tolist()}")
    if bool((seq_lens.long() < q_lens).any()):
        raise ValueError(f"{name}: seq_lens {seq_lens.tolist()} shorter than the query lengths "
                         f"{q_lens.tolist()}")
    need = (seq_lens.long() + block_size - 1) // block_size
    if bool((need > block_tables.shape[1]).any()):
        raise ValueError(f"{name}: seq_lens need up to {int(need.max())} blocks, block_tables "
                         f"has {block_tables.shape[1]} columns")
    used = torch.arange(block_tables.shape[1]).unsqueeze(0) < need.unsqueeze(1)
    ids = block_tables.long()[used]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_blocks):
        raise ValueError(f"{name}: block_tables reference blocks outside [0, {n_blocks})")


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def pick_splits(num_sms: int | None, n_programs: int, max_tiles: int) -> int:
    """Split along KV (flash-decoding) only when the grid would leave SMs idle (few requests,
    long contexts). num_sms None = the interpreter, which runs programs one by one: never."""
    if num_sms is None:
        return 1
    splits = triton.cdiv(4 * num_sms, max(n_programs, 1))
    # Keep >= 2 tiles of keys per split so each program still streams a while.
    return max(1, min(splits, max_tiles // 2, 64))


def paged_attention_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
    num_splits: int | None = None, tile_n: int | None = None,
) -> torch.Tensor:
    """Same contract as paged_attention_ref. num_splits / tile_n override the launch
    heuristics (tests use them to cover the split-KV combine and tile edges)."""
    _validate(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    n_tokens, n_heads, head_dim = q.shape
    _, block_size, n_kv_heads, _ = k_cache.shape
    n_requests = block_tables.shape[0]
    out = torch.empty((n_tokens, n_heads, head_dim), dtype=q.dtype, device=q.device)
    if n_tokens == 0 or n_requests == 0:
        return out
    group = n_heads // n_kv_heads
    g_pad = triton.next_power_of_2(group)
    d_pad = max(16, triton.next_power_of_2(head_dim))
    # Decode batches (one token per request) get small query blocks; prefill chunks get
    # 64 rows so tl.dot has work. Both only size the blocks: any batch is handled correctly.
    block_m = max(16 if n_tokens <= n_requests else 64, g_pad)
    block_q = block_m // g_pad
    tile = tile_n or (64 if d_pad <= 128 else 32)
    max_tiles = triton.cdiv(block_tables.shape[1] * block_size, tile)
    n_qblocks = n_tokens // block_q + n_requests  # grid bound; surplus programs exit at once
    busy = n_requests if n_tokens <= n_requests else n_qblocks
    sms = _num_sms(q.device.index or 0) if q.is_cuda else None
    splits = num_splits or pick_splits(sms, busy * n_kv_heads, max_tiles)
    if splits > 1:
        part_acc = torch.empty((splits, n_tokens, n_heads, head_dim), dtype=torch.float32,
                               device=q.device)
        part_m = torch.empty((splits, n_tokens, n_heads), dtype=torch.float32, device=q.device)
        part_l = torch.zeros((splits, n_tokens, n_heads), dtype=torch.float32, device=q.device)
    else:
        part_acc = part_m = part_l = out  # unused when NUM_SPLITS == 1
    _paged_attention_kernel[(n_qblocks, n_kv_heads, splits)](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out,
        part_acc, part_m, part_l,
        float(scale) * _LOG2E, n_requests, n_tokens, n_heads,
        q.stride(0), q.stride(1), block_tables.stride(0), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), head_dim, block_size, block_tables.shape[1], group,
        BLOCK_Q=block_q, G_PAD=g_pad, D_PAD=d_pad, TILE_N=tile, NUM_SPLITS=splits,
        DOT_FP32=(not q.is_cuda) or q.dtype == torch.float32,
        num_warps=4, num_stages=2,
    )
    if splits > 1:
        _combine_splits_kernel[(n_tokens, n_heads)](
            part_acc, part_m, part_l, out, n_tokens, n_heads, head_dim,
            NUM_SPLITS=splits, S_PAD=triton.next_power_of_2(splits), D_PAD=d_pad,
        )
    return out
