"""``carpool bench gpu``: the GPU path checked in one run when a CUDA machine is lent (issue 12).

1. greedy equality: Carpool (Triton kernels, ``--dtype``) against transformers on the same
   device and dtype, token for token, over a few chat prompts;
2. ``carpool bench kernels`` (the Triton kernels vs their references, HBM bandwidth);
3. seed 000's workload (100 requests, 20/200 tokens, ignore_eos) through Carpool and through
   transformers' continuous batching, tokens/s side by side.
Then one summary table. Without CUDA it prints why and exits 0 without timing anything.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

NO_CUDA = ("carpool bench gpu: no CUDA device here; this check needs a GPU machine "
           "(on CPU use carpool bench engine / carpool bench serve).")
PROMPTS = ("Write about the sea.", "What is the capital of France?", "Explain photosynthesis.")


def greedy_equality(model: str | None, dtype: str, max_tokens: int) -> tuple[int, int]:
    """(prompts whose greedy tokens equal transformers', prompts)."""
    from engine.bench.engine import load_hf
    from engine.core.sampling_params import SamplingParams
    from engine.llm_engine import LLMEngine

    engine = LLMEngine.from_kwargs(model=model, dtype=dtype, device="cuda")
    hf = load_hf(str(engine.runner.model_dir)).to("cuda", getattr(torch, dtype))
    same = 0
    for i, text in enumerate(PROMPTS):
        ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                   tokenize=True, add_generation_prompt=True)
        ids = list(ids if isinstance(ids, list) else ids["input_ids"])
        engine.add_request(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                           request_id=f"g{i}")
        ours: list[int] = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                ours += out.new_token_ids
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([ids], device="cuda"), max_new_tokens=max_tokens,
                              min_new_tokens=max_tokens, do_sample=False)[0, len(ids):].tolist()
        same += ours == ref
    return same, len(PROMPTS)


def seed_workload(model: str | None, dtype: str) -> dict[str, float]:
    """tokens/s of Carpool and of transformers' continuous batching on the seed workload."""
    from engine.bench.engine import load_hf, make_workload, run_hf_continuous
    from engine.core.sampling_params import SamplingParams
    from engine.llm_engine import LLMEngine

    engine = LLMEngine.from_kwargs(model=model, dtype=dtype, device="cuda")
    wl = make_workload(engine.tokenizer, 100, 20, 200)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    torch.cuda.synchronize()
    start = time.monotonic()
    for i, (p, n) in enumerate(zip(wl.prompts, wl.output_lens)):
        engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True), request_id=f"w{i}")
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    ours = tokens / (time.monotonic() - start)
    hf = load_hf(str(engine.runner.model_dir)).to("cuda", getattr(torch, dtype))
    row = run_hf_continuous(hf, wl, kv_tokens=65536, max_batch_tokens=2048)
    return {"carpool": ours, "transformers": row.tok_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="carpool bench gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_CUDA)
        return 0
    from kernels.bench import gpu_kernels as kernels_bench

    print(f"device: {torch.cuda.get_device_name()}, dtype {args.dtype}", flush=True)
    same, total = greedy_equality(args.model, args.dtype, args.max_tokens)
    kernels_bench.main(["--dtype", args.dtype] if args.dtype != "float32" else [])
    seed = seed_workload(args.model, args.dtype)
    print(_summary(same, total, seed))
    return 0 if same == total else 1


def _summary(same: int, total: int, seed: dict[str, Any]) -> str:
    return "\n".join([
        "| check | result |", "|---|---|",
        f"| greedy tokens equal to transformers | {same}/{total} prompts |",
        f"| seed workload, Carpool | {seed['carpool']:.1f} tok/s |",
        f"| seed workload, transformers continuous batching | {seed['transformers']:.1f} tok/s |",
        f"| Carpool / transformers | {seed['carpool'] / seed['transformers']:.2f} |",
        "| kernels | the table printed above (carpool bench kernels) |",
    ])


if __name__ == "__main__":
    raise SystemExit(main())
