"""ModelRunner: pool sizing, swap copies, sampling only the rows that ask, step ordering."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.core.outputs import SchedulerOutput
from engine.core.sampling_params import SamplingParams
from tests.engine.runner.helpers import (
    BlockTables,
    chunk,
    execute,
    hf_logits,
    hf_model,
    make_runner,
    step_logits,
)

ATOL = 1e-5


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49152) for _ in range(n)]


def test_pools_are_sized_from_memory_budgets(tiny_model_dir: Path) -> None:
    runner = make_runner(tiny_model_dir, "float32", num_blocks=None, num_cpu_blocks=None,
                         kv_cache_memory_gb=0.01, swap_space_gb=0.005)
    # tiny llama: 2 layers x (K, V) x 4 tokens x 2 kv heads x head_dim 16 x 4 bytes
    per_block = 2 * 2 * 4 * 2 * 16 * 4
    assert runner.bytes_per_block == per_block
    assert runner.num_blocks == int(0.01 * (1 << 30)) // per_block
    assert runner.num_cpu_blocks == int(0.005 * (1 << 30)) // per_block
    # one scratch block past the pool holds the padding rows of fixed-shape batches
    assert runner.kv_cache.shape == (2, 2, runner.num_blocks + 1, 4, 2, 16)
    assert runner.padding_block == runner.num_blocks
    assert runner.cpu_cache.shape == (2, 2, runner.num_cpu_blocks, 4, 2, 16)
    explicit = make_runner(tiny_model_dir, "float32", num_blocks=10, num_cpu_blocks=3)
    assert (explicit.num_blocks, explicit.num_cpu_blocks) == (10, 3)


def test_the_cache_summary_states_the_pools_as_allocated(tiny_model_dir: Path) -> None:
    """The start-up line's numbers come from the tensors themselves: blocks and tokens from
    the cache's shape, MiB from its bytes (less the scratch block), concurrency at the full
    context from the tokens."""
    runner = make_runner(tiny_model_dir, "float32", num_blocks=100, num_cpu_blocks=7)
    cache = runner.kv_cache
    blocks = cache.shape[2] - 1
    tokens = blocks * cache.shape[3]
    mib = cache.numel() * cache.element_size() * blocks / (blocks + 1) / (1 << 20)
    assert runner.cache_summary() == (
        f"KV cache: {blocks} blocks of {cache.shape[3]} tokens = {tokens} tokens "
        f"({mib:.1f} MiB float32 on cpu), swap {runner.cpu_cache.shape[2]} blocks; "
        f"{tokens / runner.max_model_len:.2f}x concurrency at the full "
        f"{runner.max_model_len}-token context")


def test_swap_out_then_in_preserves_kv_exactly(tiny_model_dir: Path) -> None:
    runner = make_runner(tiny_model_dir, num_blocks=16, num_cpu_blocks=8)
    prompt = _tokens(10, seed=1)  # 3 blocks of 4
    blocks = BlockTables(16, 4)
    execute(runner, [chunk("a", prompt, 0, blocks)])
    old = blocks.tables["a"]
    saved = runner.kv_cache[:, :, old].clone()
    assert saved.abs().sum() > 0
    runner.execute(SchedulerOutput(swap_out=list(zip(old, [5, 2, 7], strict=True))))
    runner.kv_cache[:, :, old] = 0.0  # the device blocks get reused by someone else
    new = [15, 14, 13]
    runner.execute(SchedulerOutput(swap_in=list(zip([5, 2, 7], new, strict=True))))
    assert torch.equal(runner.kv_cache[:, :, new], saved)
    # and decoding continues correctly from the swapped-in blocks
    nxt = _tokens(1, seed=2)
    blocks.tables["a"] = list(new)
    (got,) = step_logits(runner, [chunk("a", nxt, 10, blocks)])
    want = hf_logits(hf_model(tiny_model_dir), prompt + nxt)[-1:]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_swaps_run_before_the_forward_in_one_step(tiny_model_dir: Path) -> None:
    """Swap-in of a request's blocks and its decode token in the same step."""
    runner = make_runner(tiny_model_dir, num_blocks=16, num_cpu_blocks=8)
    prompt = _tokens(6, seed=3)
    blocks = BlockTables(16, 4)
    execute(runner, [chunk("a", prompt, 0, blocks)])
    old = blocks.tables["a"]
    runner.execute(SchedulerOutput(swap_out=list(zip(old, [0, 1], strict=True))))
    runner.kv_cache.zero_()
    blocks.tables["a"] = [9, 4]
    nxt = _tokens(1, seed=4)
    out = runner.execute(SchedulerOutput(
        scheduled=[chunk("a", nxt, 6, blocks)], swap_in=[(0, 9), (1, 4)]
    ))
    want = hf_logits(hf_model(tiny_model_dir), prompt + nxt)[-1]
    assert out.sampled == {"a": int(want.argmax())}


def test_a_copied_block_serves_a_partial_prefix_in_order(tiny_model_dir: Path) -> None:
    """Swap-out, then the partial-prefix copy, then swap-in and the forward, in one step: the
    swap-out saves the destination's old KV, the copy lands before the forward reads it, and
    a swap-in into the copy's source comes after the copy has read it."""
    runner = make_runner(tiny_model_dir, num_blocks=16, num_cpu_blocks=8)
    prompt = _tokens(10, seed=5)  # blocks of 4: [0..3] [4..7] [8, 9]
    blocks = BlockTables(16, 4)
    execute(runner, [chunk("a", prompt, 0, blocks)])
    a = blocks.tables["a"]
    dst = blocks.free.pop()
    old_dst = runner.kv_cache[:, :, dst].clone()
    source_kv = runner.kv_cache[:, :, a[1]].clone()
    runner.cpu_cache[:, :, 3] = 7.0  # what the swap-in writes into the source afterwards
    blocks.tables["b"] = [a[0], dst]  # b: a's first block shared, 2 tokens of the second copied
    follow = prompt[:6] + _tokens(3, seed=6)
    out = runner.execute(SchedulerOutput(
        scheduled=[chunk("b", follow[6:], 6, blocks)],
        swap_out=[(dst, 5)], copies=[(a[1], dst)], swap_in=[(3, a[1])],
    ))
    assert torch.equal(runner.cpu_cache[:, :, 5], old_dst)
    assert torch.equal(runner.kv_cache[:, :, dst, :2], source_kv[:, :, :2])  # positions 4, 5
    assert bool((runner.kv_cache[:, :, a[1]] == 7.0).all())
    want = hf_logits(hf_model(tiny_model_dir), follow)[-1]
    assert out.sampled == {"b": int(want.argmax())}


def test_only_rows_that_sample_get_a_token_and_it_is_greedy(tiny_model_dir: Path) -> None:
    runner = make_runner(tiny_model_dir)
    ref = hf_model(tiny_model_dir)
    blocks = BlockTables(runner.num_blocks, runner.block_size)
    a, b, c = _tokens(9, 5), _tokens(3, 6), _tokens(12, 7)
    out = runner.execute(SchedulerOutput(scheduled=[
        chunk("a", a, 0, blocks),
        chunk("b", b[:2], 0, blocks, sample=False),  # a non-final prefill chunk
        chunk("c", c, 0, blocks, params=SamplingParams(temperature=0.0), output_index=0),
    ]))
    assert set(out.sampled) == {"a", "c"}
    assert out.sampled["a"] == int(hf_logits(ref, a)[-1].argmax())
    assert out.sampled["c"] == int(hf_logits(ref, c)[-1].argmax())
    out = runner.execute(SchedulerOutput(scheduled=[chunk("b", b[2:], 2, blocks)]))
    assert out.sampled == {"b": int(hf_logits(ref, b)[-1].argmax())}


def test_padding_rows_cost_compute_but_change_no_token_and_no_pool_block(
    tiny_model_dir: Path,
) -> None:
    ref = hf_model(tiny_model_dir)
    plain, padded = make_runner(tiny_model_dir), make_runner(tiny_model_dir)
    blocks = BlockTables(plain.num_blocks, plain.block_size)
    a, b = _tokens(9, 8), _tokens(5, 9)
    scheduled = [chunk("a", a, 0, blocks), chunk("b", b, 0, blocks)]
    want = plain.execute(SchedulerOutput(scheduled=scheduled))
    got = padded.execute(SchedulerOutput(scheduled=scheduled, num_padding_rows=3))
    assert got.sampled == want.sampled == {
        "a": int(hf_logits(ref, a)[-1].argmax()), "b": int(hf_logits(ref, b)[-1].argmax())
    }
    # The padding rows write only the scratch block: pool blocks nobody holds stay exactly
    # zero. The held blocks match closely, not bit for bit: a batch with more rows may take
    # another BLAS kernel or thread split on another CPU (seen on a 2-core EPYC w/o AVX-512).
    held = sorted(set(blocks.tables["a"]) | set(blocks.tables["b"]))
    free = [i for i in range(padded.num_blocks) if i not in held]
    assert torch.count_nonzero(padded.kv_cache[:, :, free]) == 0
    torch.testing.assert_close(padded.kv_cache[:, :, held], plain.kv_cache[:, :, held],
                               atol=1e-12, rtol=1e-9)
    assert plain.kv_cache[:, :, held].abs().sum() > 0
    assert padded.kv_cache[:, :, padded.padding_block].abs().sum() > 0  # the rows really ran
    inputs = padded.prepare_inputs(scheduled, num_padding_rows=3)
    assert inputs.input_ids.numel() == len(a) + len(b) + 3
    assert inputs.logits_indices.numel() == 5 and len(inputs.sample_rows) == 2
    # like a padded generate row, a padding row attends over the batch's longest context
    assert inputs.meta.seq_lens.tolist() == [len(a), len(b), len(a), len(a), len(a)]
    assert set(inputs.meta.block_tables[2:].flatten().tolist()) == {padded.padding_block}


def test_runner_exposes_tokenizer_and_limits(tiny_model_dir: Path) -> None:
    runner = make_runner(tiny_model_dir)
    assert runner.eos_token_id == 2 and 2 in runner.eos_token_ids
    assert runner.max_model_len == 2048
    assert runner.model_name == tiny_model_dir.name
    assert runner.tokenizer.decode(runner.tokenizer.encode("hello world")) == "hello world"
    assert runner.execute(SchedulerOutput()).sampled == {}


def test_plain_greedy_rows_take_the_screened_head_and_get_the_same_tokens(
    tiny_model_dir: Path,
) -> None:
    """fp32: a step whose rows are all plain greedy picks its tokens on the screened head
    (kernels.greedy_head); every token equals the full head's argmax (a runner without the
    screen, fed the same steps). A row with logprobs takes the logits path."""
    from kernels import cpu_small_linear

    if not cpu_small_linear.available() or not cpu_small_linear.has_half():
        pytest.skip("small-batch linear op not built with fp16 loads")
    screened, full = make_runner(tiny_model_dir, "float32"), make_runner(tiny_model_dir, "float32")
    head = screened.model.logits_linear
    assert head is not None and head.screen is not None  # type: ignore[attr-defined]
    full.model.logits_linear.screen = None  # type: ignore[union-attr]
    calls: list[int] = []
    real = head.greedy_tokens  # type: ignore[attr-defined]

    def spy(x: torch.Tensor) -> list[int] | None:
        calls.append(len(x))
        tokens: list[int] | None = real(x)
        assert tokens is not None  # decided by the screen, not handed back
        return tokens

    head.greedy_tokens = spy  # type: ignore[attr-defined]
    tables = {id(r): BlockTables(r.num_blocks, r.block_size) for r in (screened, full)}
    seqs = {"a": _tokens(9, 11), "b": _tokens(5, 12)}
    for step in range(12):
        outs = []
        for r in (screened, full):
            outs.append(execute(r, [chunk(rid, toks if step == 0 else toks[-1:],
                                          0 if step == 0 else len(toks) - 1, tables[id(r)])
                                    for rid, toks in seqs.items()]))
        assert outs[0] == outs[1]
        for rid, toks in seqs.items():
            toks.append(outs[0][rid])
    assert calls == [2] * 12
    # a fixed-shape batch's padding rows go through the head too (a seat costs the same
    # whether its request runs or not) and change no token
    step = {r: [chunk(rid, toks[-1:], len(toks) - 1, tables[id(r)]) for rid, toks in seqs.items()]
            for r in (screened, full)}
    padded = screened.execute(SchedulerOutput(scheduled=step[screened], num_padding_rows=2))
    assert padded.sampled == execute(full, step[full]) and calls[-1] == 4
    calls.clear()
    rows = [chunk("c", _tokens(6, 13), 0, tables[id(screened)],
                  params=SamplingParams(temperature=0.0, logprobs=1))]
    out = screened.execute(SchedulerOutput(scheduled=rows))
    assert calls == [] and out.logprobs  # logprobs: the full head's logits
