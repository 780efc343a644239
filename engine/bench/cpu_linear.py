"""``python -m engine.bench.cpu_linear``: a decode step's fp32 linears on CPU, the small-batch
op (``kernels.cpu_small_linear``) against oneDNN's packed inner product
(``kernels.cpu_linear``), beside the machine's read bandwidth, in one table.

What one pass is: SmolLM2-135M's linears in forward order, 30 layers of qkv, o, gate_up and
down with DISTINCT weights per layer, then the tied LM head (540 MB of fp32): a real step
streams every weight from memory, so timing one matrix reused for all layers (its 14 MB sit in
L3) would flatter both sides. The bound column is ``torch.sum`` over one tensor of the same
540 MB: what reading those bytes costs on this machine at that thread count. Best of
``--repeats`` passes; same run, same machine, so only the ratios travel between machines.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from engine.bench.calibrate import cpu_name
from kernels import cpu_linear, cpu_small_linear

HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 576, 1536, 30, 49152
SHAPES = {"qkv": (960, HIDDEN), "o": (HIDDEN, HIDDEN), "gate_up": (2 * INTERMEDIATE, HIDDEN),
          "down": (HIDDEN, INTERMEDIATE)}


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def weights() -> list[tuple[int, torch.Tensor]]:
    """(out features, [out, in] weight) for every linear of one forward, in order."""
    gen = torch.Generator().manual_seed(0)
    out = [(n, torch.randn(n, k, generator=gen) * 0.05)
           for _ in range(LAYERS) for n, k in SHAPES.values()]
    return [*out, (VOCAB, torch.randn(VOCAB, HIDDEN, generator=gen) * 0.05)]


def one_pass(ops: list[tuple[int, Callable[[torch.Tensor], torch.Tensor]]],
             inputs: dict[int, torch.Tensor]) -> Callable[[], None]:
    def run() -> None:
        for in_features, op in ops:
            op(inputs[in_features])
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.cpu_linear", description=__doc__)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if not (cpu_small_linear.available() and cpu_linear.available(torch.empty(1))):
        print("engine.bench.cpu_linear: needs the small-batch op built (make setup) and oneDNN")
        return 1
    ws = weights()
    small = [(w.shape[1], _small(cpu_small_linear.pack(w), n)) for n, w in ws]
    onednn = [(w.shape[1], _onednn(cpu_linear.pack(w))) for _, w in ws]
    megabytes = sum(w.numel() for _, w in ws) * 4 / 1e6
    flat = torch.randn(sum(w.numel() for _, w in ws))
    del ws
    print(f"one forward's fp32 linears (SmolLM2-135M shapes, {LAYERS} layers of distinct "
          f"weights + LM head, {megabytes:.0f} MB), best of {args.repeats}; CPU: {cpu_name()}")
    print("| threads | rows | read bound ms (GB/s) | small-batch op ms | oneDNN ms | oneDNN / op |")
    print("|---|---|---|---|---|---|")
    before = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            bound = best_ms(lambda: flat.sum(), args.repeats)
            for rows in args.rows:
                inputs = {k: torch.randn(rows, k) for k in (HIDDEN, INTERMEDIATE)}
                ours = best_ms(one_pass(small, inputs), args.repeats)
                theirs = best_ms(one_pass(onednn, inputs), args.repeats)
                print(f"| {threads} | {rows} | {bound:.1f} ({megabytes / bound:.1f}) | "
                      f"{ours:.1f} | {theirs:.1f} | {theirs / ours:.2f} |")
    finally:
        torch.set_num_threads(before)
    return 0


def _small(packed: torch.Tensor, n: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: cpu_small_linear.linear(x, packed, None, n)


def _onednn(packed: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: cpu_linear.linear(x, packed, None)


if __name__ == "__main__":
    raise SystemExit(main())
