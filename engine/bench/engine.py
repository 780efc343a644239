"""`carpool bench engine`: seed 000's workload, Carpool against transformers, one table.
(``--decode-kernels``: the Triton-vs-reference decode throughput instead, on CUDA;
``--structured``: the TPOT of a half-constrained batch against a free one,
``engine/bench/structured_tpot.py``.)

100 requests alternating 20 and 200 output tokens (exact, ignore_eos), short varied prompts,
all arriving at once, SmolLM2 fp32. The padded transformers row, slow by design, runs on a
prefix of the workload (``--small-n``); tokens/s stays comparable. The two 4-slot rows run
the whole workload by default (``--slots-n``): on a short prefix the continuous row's tail
(its last long requests finishing with seats empty) weighs more than in the seed's steady
state, and the ratio of the two rows would say less about the seats. Ratios are
against the best transformers row measured in the same run, and against the compute bound
measured in the same run (the machine's fp32 matmul rate on the model's own layer shapes
divided by the model's FLOPs per token).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.bench import ceiling
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine

TOPICS = [
    "the sea", "a lighthouse", "bread", "trains", "the moon", "tea", "a violin", "winter",
    "bees", "a library", "rain", "mountains", "a clock", "chess", "a garden", "rivers",
]


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    def head(self, n: int) -> Workload:
        return Workload(self.prompts[:n], self.output_lens[:n])


@dataclass
class Row:
    name: str
    n: int
    wall_s: float
    useful_tokens: int
    latencies: list[float]
    lens: list[int]
    is_transformers: bool = False
    step_rows: list[int] = field(default_factory=list)  # matmul rows (tokens) per step
    step_heads: list[int] = field(default_factory=list)  # LM-head rows (rows that sample)

    @property
    def tok_s(self) -> float:
        return self.useful_tokens / self.wall_s

    def mean_latency(self, short: bool) -> float:
        cut = min(self.lens) if short else max(self.lens)
        vals = [lat for lat, n in zip(self.latencies, self.lens) if n == cut]
        return sum(vals) / max(1, len(vals))


def make_workload(tokenizer: Any, n: int, short: int, long: int) -> Workload:
    prompts, lens = [], []
    for i in range(n):
        text = f"Write about {TOPICS[i % len(TOPICS)]}" + (" in detail" if i % 3 == 0 else "") + "."
        prompts.append(list(tokenizer.encode(text, add_special_tokens=False)))
        lens.append(short if i % 2 == 0 else long)
    return Workload(prompts, lens)


# -- Carpool rows -------------------------------------------------------------------------

KV_ROW = "Carpool continuous, fp16 KV cache"


def run_carpool(name: str, wl: Workload, model: str | None, **kw: Any) -> Row:
    engine = LLMEngine.from_kwargs(model=model, dtype="float32", **kw)
    _warm(engine)
    step_rows: list[int] = []
    step_heads: list[int] = []

    def observe(out: Any, _s: float) -> None:
        rows, heads = ceiling.step_rows(out)
        step_rows.append(rows)
        step_heads.append(heads)

    engine.step_observers.append(observe)
    start = time.monotonic()
    for i, (p, n) in enumerate(zip(wl.prompts, wl.output_lens)):
        params = SamplingParams(max_tokens=n, ignore_eos=True)
        engine.add_request(p, params, request_id=f"b{i}", arrival_time=start)
    done: dict[str, float] = {}
    counts: dict[str, int] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            counts[out.request_id] = counts.get(out.request_id, 0) + len(out.new_token_ids)
            if out.finished:
                done[out.request_id] = time.monotonic() - start
    wall = time.monotonic() - start
    lats = [done[f"b{i}"] for i in range(len(wl.prompts))]
    useful = sum(counts.values())
    assert useful == sum(wl.output_lens), f"{name}: {useful} tokens != {sum(wl.output_lens)}"
    return Row(name, len(wl.prompts), wall, useful, lats, wl.output_lens, step_rows=step_rows,
               step_heads=step_heads)


def _warm(engine: LLMEngine) -> None:
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


# -- transformers rows ----------------------------------------------------------------------


def load_hf(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    return m.eval()


def run_hf_padded(hf: Any, wl: Workload, batch: int, pad_id: int) -> Row:
    start = time.monotonic()
    lats: list[float] = []
    for b in range(0, len(wl.prompts), batch):
        prompts, lens = wl.prompts[b : b + batch], wl.output_lens[b : b + batch]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            hf.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max(lens),
                min_new_tokens=max(lens), do_sample=False, pad_token_id=pad_id,
            )
        # Everyone in a static batch gets their answer when the longest finishes.
        lats += [time.monotonic() - start] * len(prompts)
    wall = time.monotonic() - start
    name = f"transformers generate, padded batches of {batch}"
    return Row(name, len(wl.prompts), wall, sum(wl.output_lens), lats, wl.output_lens, True)


def run_hf_continuous(hf: Any, wl: Workload, kv_tokens: int, max_batch_tokens: int) -> Row:
    """transformers' continuous batching on ``wl`` with a KV cache of ``kv_tokens`` tokens."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(do_sample=False, eos_token_id=None, max_new_tokens=max(wl.output_lens))
    # Its blocks are pages of ``page_size`` tokens (256 by default since 5.17; ``block_size``
    # before), so the cache is sized in tokens: 512 blocks became 131k tokens (6 GB fp32)
    # and the run stopped on a MemoryError.
    default = ContinuousBatchingConfig()
    page: int = getattr(default, "page_size", None) or getattr(default, "block_size", 32) or 32
    cb = ContinuousBatchingConfig(num_blocks=-(-kv_tokens // page),
                                  max_batch_tokens=max_batch_tokens)
    start = time.monotonic()
    done: dict[str, float] = {}
    useful = 0
    with hf.continuous_batching_context_manager(
        generation_config=gen, continuous_batching_config=cb, block=True, timeout=5
    ) as manager:
        for i, (p, n) in enumerate(zip(wl.prompts, wl.output_lens)):
            manager.add_request(p, request_id=f"t{i}", max_new_tokens=n, eos_token_id=-1)
        while len(done) < len(wl.prompts):
            res = manager.get_result(timeout=1)
            if res is not None and res.is_finished():
                done[res.request_id] = time.monotonic() - start
                useful += len(res.generated_tokens)
    wall = time.monotonic() - start
    lats = [done[f"t{i}"] for i in range(len(wl.prompts))]
    name = "transformers continuous batching (generate_batch manager)"
    return Row(name, len(wl.prompts), wall, useful, lats, wl.output_lens, True)


# -- compute bound ------------------------------------------------------------------------


def model_linear_shapes(cfg: Any) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    h, hd = cfg.hidden_size, cfg.hidden_size // cfg.num_attention_heads
    qkv = h + 2 * cfg.num_key_value_heads * hd
    layer = [(h, qkv), (h, h), (h, 2 * cfg.intermediate_size), (cfg.intermediate_size, h)]
    return layer, (h, cfg.vocab_size)


def _matmul_seconds(cfg: Any, tokens: int, repeats: int) -> tuple[float, float]:
    """Best time of every linear layer of one forward over ``tokens`` rows, and its FLOPs."""
    layer, head = model_linear_shapes(cfg)
    mats = [(torch.randn(tokens, k), torch.randn(k, n)) for k, n in layer + [head]]
    counts = [cfg.num_hidden_layers] * len(layer) + [1]
    flops = 2.0 * tokens * sum(k * n * c for (k, n), c in zip(layer + [head], counts))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for (a, b), c in zip(mats, counts):
            for _ in range(c):
                torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return best, flops


def compute_bound(cfg: Any, tokens: int = 128, repeats: int = 5) -> tuple[float, float, float]:
    """Returns (GFLOP/s on the model's shapes, GFLOP per token, tokens/s bound)."""
    seconds, flops = _matmul_seconds(cfg, tokens, repeats)
    rate, flops_per_token = flops / seconds, flops / tokens
    return rate / 1e9, flops_per_token / 1e9, rate / flops_per_token


def matmul_ceiling(cfg: Any, row: Row, repeats: int = 3) -> float:
    """Tokens/s of ``row``'s workload if each step cost only its matmuls at the batch sizes it
    really ran: no attention, no overhead. What no fp32 engine on this BLAS could beat."""
    counts: dict[int, int] = {}
    for m in row.step_rows:
        counts[m] = counts.get(m, 0) + 1
    total = sum(c * _matmul_seconds(cfg, m, repeats)[0] for m, c in counts.items())
    return row.useful_tokens / total


def ceiling_lines(row: Row, cfg: Any, model: Any, bound: float, wl: Workload,
                  model_name: str | None, **kw: Any) -> str:
    """The linear-only ceiling at the batch sizes ``row`` ran (engine.bench.ceiling: the
    engine's linears on the model's streamed weights), timed after the run and, in a second
    run of the same workload, step by step beside each step (``ceiling.interleaved``); the
    old cached-weight aten ceiling beside them for continuity. ``kw``: the row's engine
    options (the interleaved run's engine takes them too)."""
    from engine.bench.ceiling import interleaved, linear_ceiling

    ceiling = linear_ceiling(model, zip(row.step_rows, row.step_heads), row.useful_tokens)
    old = matmul_ceiling(cfg, row)
    engine = LLMEngine.from_kwargs(model=model_name, dtype="float32", **kw)
    _warm(engine)
    same = interleaved(engine, [(p, SamplingParams(max_tokens=n, ignore_eos=True))
                                for p, n in zip(wl.prompts, wl.output_lens)])
    return (f"linear-only ceiling at the batch sizes '{row.name}' ran ({len(row.step_rows)} "
            f"steps; the engine's linears, the model's weights): {ceiling:.0f} tok/s; the row "
            f"reaches {100 * row.tok_s / ceiling:.0f}% of it (ceiling timed after the run)\n"
            f"  interleaved, a second run of the same workload with each step's linears timed "
            f"right after it ({same.steps} steps): steps {same.step_s:.1f} s, their linears "
            f"alone {same.linear_s:.1f} s: the engine reaches {100 * same.share:.0f}% of its "
            f"ceiling\n"
            f"  (old definition: aten mm, one cached weight per shape: {old:.0f} tok/s = "
            f"{100 * old / bound:.0f}% of the bound; the row reaches {100 * row.tok_s / old:.0f}%)")


# -- table --------------------------------------------------------------------------------


def print_table(rows: list[Row], bound_tok_s: float) -> None:
    hf_rows = [r for r in rows if r.is_transformers]
    best_hf = max((r.tok_s for r in hf_rows), default=float("nan"))
    head = f"{'row':<58} {'n':>4} {'wall s':>8} {'tok/s':>8} {'x best HF':>9} {'% bound':>8} {'short lat s':>11} {'long lat s':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.name:<58} {r.n:>4} {r.wall_s:>8.1f} {r.tok_s:>8.1f} {r.tok_s / best_hf:>9.2f} "
            f"{100 * r.tok_s / bound_tok_s:>7.0f}% {r.mean_latency(True):>11.2f} {r.mean_latency(False):>10.2f}"
        )


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="carpool bench engine", description=__doc__)
    ap.add_argument("--model", default=None, help="local checkpoint (default: SmolLM2)")
    ap.add_argument("--num-requests", type=int, default=100)
    ap.add_argument("--small-n", type=int, default=20, help="requests for the padded HF row")
    ap.add_argument("--slots-n", type=int, default=None,
                    help="requests for the two 4-slot rows (default: all)")
    ap.add_argument("--short", type=int, default=20)
    ap.add_argument("--long", type=int, default=200)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--steady-n", type=int, default=400,
                    help="requests queued for the steady-state 4-slot rows (0: skip them)")
    ap.add_argument("--steady-s", type=float, default=60.0,
                    help="a steady-state window ends when its own steps have taken this long, "
                         "if the queue has not emptied first (the two modes step in turn)")
    ap.add_argument("--quantization", choices=("int8",), default=None,
                    help="add a row with int8 weights, and its quality against fp32")
    ap.add_argument("--kv-cache-dtype", choices=("float16",), default=None,
                    help="add a row with an fp16 KV cache (fp32 weights), its linear-only "
                         "ceiling and its quality against fp32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--structured", action="store_true",
                    help="TPOT of a batch half constrained by a JSON Schema vs the same free")
    ap.add_argument("--batch", type=int, default=8, help="--structured: requests per batch")
    ap.add_argument("--tokens", type=int, default=64, help="--structured: tokens per request")
    ap.add_argument("--repeats", type=int, default=3, help="--structured: alternating runs")
    ap.add_argument("--decode-kernels", action="store_true",
                    help="instead: decode throughput on the Triton kernels vs the torch "
                         "references (CUDA; engine.bench.decode_attention)")
    ap.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16",
                    help="with --decode-kernels")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.decode_kernels:
        from engine.bench.decode_attention import run

        return run(args.model, args.dtype)
    if args.structured:
        from engine.bench import structured_tpot

        return structured_tpot.main(args)
    if args.threads:
        torch.set_num_threads(args.threads)

    probe = LLMEngine.from_kwargs(model=args.model, dtype="float32", num_blocks=8)
    from engine.runner.loader import load_hf_config

    model_dir, tok = probe.runner.model_dir, probe.tokenizer
    cfg = load_hf_config(model_dir)
    model = probe.runner.model  # kept for the linear-only ceiling (the engine's own linears)
    del probe
    wl = make_workload(tok, args.num_requests, args.short, args.long)
    small = wl.head(min(args.small_n, args.num_requests))
    slots = wl.head(min(args.slots_n or args.num_requests, args.num_requests))

    rows: list[Row] = []
    plan: list[Callable[[], Row]] = [
        lambda: run_carpool("Carpool continuous (default limits)", wl, args.model),
        lambda: run_carpool("Carpool continuous, 4 slots", slots, args.model, max_num_seqs=4),
        lambda: run_carpool(
            "Carpool static, 4 slots", slots, args.model, max_num_seqs=4, batching="static"
        ),
    ]
    if args.quantization:
        plan.append(lambda: run_carpool(f"Carpool continuous, {args.quantization} weights", wl,
                                        args.model, quantization=args.quantization))
    if args.kv_cache_dtype:
        plan.append(lambda: run_carpool(KV_ROW, wl, args.model,
                                        kv_cache_dtype=args.kv_cache_dtype))
    if not args.skip_transformers:
        hf = load_hf(str(model_dir))
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        plan += [
            lambda: run_hf_padded(hf, small, 16, pad),
            lambda: run_hf_continuous(hf, wl, kv_tokens=16384, max_batch_tokens=512),
        ]
    for step in plan:
        rows.append(step())
        print(f"  done: {rows[-1].name} ({rows[-1].wall_s:.1f} s)", flush=True)
    finite_ratio = _report(rows, cfg, model, wl, args.model, args.kv_cache_dtype)
    _extras(args, tok, finite_ratio)
    return 0


def _extras(args: argparse.Namespace, tok: Any, finite_ratio: float) -> None:
    """The steady-state 4-slot rows and the quantized engine's quality, after the table."""
    from engine.bench.cpu_attention import decode_attention_line

    print(decode_attention_line())
    if args.steady_n:
        from engine.bench.steady import run_steady_together, steady_lines

        wl = make_workload(tok, args.steady_n, args.short, args.long)
        steady = run_steady_together(
            [(f"steady {mode}, 4 slots", {"max_num_seqs": 4, "batching": mode})
             for mode in ("continuous", "static")],
            wl.prompts, wl.output_lens, args.model, args.steady_s)
        print("\n" + "\n".join(steady_lines(steady, finite_ratio)))
    variants: list[tuple[str, dict[str, Any]]] = []
    if args.quantization:
        variants.append((args.quantization, {"quantization": args.quantization}))
    if args.kv_cache_dtype:
        variants.append((f"{args.kv_cache_dtype} KV cache",
                         {"kv_cache_dtype": args.kv_cache_dtype}))
    if variants:
        from engine.bench.quality import compare

        ref = LLMEngine.from_kwargs(model=args.model, dtype="float32", num_blocks=64)
        for name, kw in variants:
            other = LLMEngine.from_kwargs(model=args.model, dtype="float32", num_blocks=64, **kw)
            print(compare(ref, other).line(name))


def _report(rows: list[Row], cfg: Any, model: Any, wl: Workload, model_name: str | None,
            kv_cache_dtype: str | None = None) -> float:
    """The table, then the ceilings and ratios measured in this run (the fp16-KV row's too,
    when it ran); returns the finite continuous/static 4-slot ratio."""
    gflops, gflop_tok, bound = compute_bound(cfg)
    print()
    print(f"compute bound: {gflops:.1f} GFLOP/s fp32 on the model's shapes / {gflop_tok:.3f} "
          f"GFLOP per token = {bound:.0f} tokens/s ({torch.get_num_threads()} threads)")
    print()
    print_table(rows, bound)
    default = rows[0]
    print()
    print(ceiling_lines(default, cfg, model, bound, wl, model_name))
    by = {r.name: r for r in rows}
    if kv_cache_dtype:
        print(ceiling_lines(by[KV_ROW], cfg, model, bound, wl, model_name,
                            kv_cache_dtype=kv_cache_dtype))
    cont4 = by["Carpool continuous, 4 slots"].tok_s
    stat4 = by["Carpool static, 4 slots"].tok_s
    print(f"\ncontinuous(4 slots) / static(4 slots) = {cont4 / stat4:.2f}  (seed 000: 80/44 = 1.82)")
    from engine.bench.scheduler import measure_scheduler_step_ms

    print(f"scheduler CPU time per step at 256 running (schedule + update, fake runner): "
          f"{measure_scheduler_step_ms(256):.3f} ms")
    return cont4 / stat4


if __name__ == "__main__":
    raise SystemExit(main())
