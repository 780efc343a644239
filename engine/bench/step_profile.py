"""Where one decode step's time goes, by part: ``python -m engine.bench.step_profile [rows ...]``.

For each batch size R: R requests of the seed workload's prompts decode until their context
is about ``context`` tokens, then ``steps`` steps are timed with a wall-clock timer around each
part (CPU ops are synchronous, so the timers add up): the linear layers (projections, MLP, LM
head), the KV-cache write of the new tokens, decode attention, RMSNorm (+ residual add), rotary,
SiLU-mul, the embedding lookup, sampling, input preparation, and the rest of ``step()``
(scheduler, output processing, Python between the ops). A decode step of a few rows runs its
whole decoder stack in one C++ call (``kernels.cpu_decode_layers``), timed as one part;
``--per-op`` turns that off, so its ops show one by one (the path it replaced). Each part is wrapped where the model
calls it (the ``kernels`` functions, ``nn.Linear.forward``), so the tool measures whichever
path (C++ op or torch reference) the engine takes. The timers' own cost, a few microseconds a
call, lands in the parts they wrap.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

import kernels
from engine.bench.engine import make_workload
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine
from engine.models import cpu_decode_step
from kernels.cpu_decode_layers import DecodeLayers
from kernels.cpu_int8_linear import Int8Linear
from kernels.cpu_linear import OneDNNLinear

# part name -> the kernels functions timed as that part
_KERNEL_PARTS = {
    "KV write": ("write_kv_cache",),
    "decode attention": ("paged_attention",),
    "rmsnorm (+ residual)": ("rms_norm", "fused_add_rms_norm"),
    "rotary": ("rotary_embedding",),
    "silu-mul": ("silu_and_mul",),
}


@contextlib.contextmanager
def _patched(obj: Any, name: str, part: str, acc: dict[str, float]) -> Iterator[None]:
    original = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            acc[part] = acc.get(part, 0.0) + time.perf_counter() - t0

    setattr(obj, name, timed)
    try:
        yield
    finally:
        setattr(obj, name, original)


def _targets(engine: LLMEngine) -> list[tuple[Any, str, str]]:
    runner = engine.runner
    model = runner.model
    out: list[tuple[Any, str, str]] = [
        (kernels, fn, part) for part, fns in _KERNEL_PARTS.items() for fn in fns
    ]
    # int8 layers' linears one by one: the int8 head is one too, timed by compute_logits
    out += [(m, "forward", "linear") for m in model.layers.modules() if isinstance(m, Int8Linear)]
    out += [(nn.Linear, "forward", "linear"), (OneDNNLinear, "forward", "linear"),
            (model, "compute_logits", "linear"),
            (model, "greedy_tokens", "LM head, greedy screen (kernels.greedy_head)"),
            (DecodeLayers, "forward", "decoder stack (one C++ call)"),
            (model.embed_tokens, "forward", "embedding"),
            (runner.sampler, "sample_batch", "sampling"),
            (runner, "prepare_inputs", "prepare inputs")]
    return out


def profile_rows(engine: LLMEngine, rows: int, context: int, steps: int) -> dict[str, float]:
    """Per-part milliseconds per step at ``rows`` decoding rows (see the module docstring)."""
    wl = make_workload(engine.tokenizer, rows, context + steps + 4, context + steps + 4)
    for i, (p, n) in enumerate(zip(wl.prompts, wl.output_lens)):
        engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True), request_id=f"p{i}")
    prompt = max(len(p) for p in wl.prompts)
    for _ in range(max(1, context - prompt)):
        engine.step()
    acc: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        for obj, name, part in _targets(engine):
            stack.enter_context(_patched(obj, name, part, acc))
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        total = time.perf_counter() - t0
    engine.abort_all()
    acc = {k: 1000 * v / steps for k, v in acc.items()}
    acc["other (scheduler, outputs, Python)"] = 1000 * total / steps - sum(acc.values())
    acc["step"] = 1000 * total / steps
    return acc


def lines(results: dict[int, dict[str, float]]) -> list[str]:
    """One column per batch size: ms per step and share of the step."""
    parts = [p for p in next(iter(results.values())) if p != "step"]
    head = f"{'part':<36}" + "".join(f"{f'{r} rows':>20}" for r in results)
    out = [head, "-" * len(head)]
    for part in [*parts, "step"]:
        cells = "".join(
            f"{res.get(part, 0.0):>11.2f} ms {100 * res.get(part, 0.0) / res['step']:>4.0f}%"
            for res in results.values())
        out.append(f"{part:<36}{cells}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.step_profile", description=__doc__)
    ap.add_argument("rows", type=int, nargs="*", default=[1, 4, 50, 100])
    ap.add_argument("--context", type=int, default=100, help="tokens of context per row")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--model", default=None)
    ap.add_argument("--per-op", action="store_true",
                    help="no whole-stack op: every layer's ops called from Python")
    ap.add_argument("--quantization", choices=("int8",), default=None,
                    help="int8 weights (the head's logits then count as linear)")
    args = ap.parse_args(argv)
    if args.per_op:
        cpu_decode_step.stack_for = lambda model: None  # type: ignore[assignment]
    engine = LLMEngine.from_kwargs(model=args.model, dtype="float32",
                                   max_num_seqs=max(args.rows), quantization=args.quantization)
    profile_rows(engine, 2, 8, 2)  # warm-up
    results = {r: profile_rows(engine, r, args.context, args.steps) for r in args.rows}
    print(f"decode step by part, context ~{args.context}, {torch.get_num_threads()} threads:")
    print("\n".join(lines(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
