"""`carpool bench engine --decode-kernels`: the engine's decode throughput with the Triton
kernels against the same engine on the torch references (generated tokens/s, prompt included
in the wall time, which is small at these lengths). Beside the kernels' own table
(``carpool bench kernels``, which imports nothing from the engine).

Without CUDA it says so and returns 0 (the Triton path runs on a GPU; on CPU only under the
interpreter, far too slow to time).
"""

from __future__ import annotations

import time

import torch

from engine.core.sampling_params import SamplingParams
from engine.frontend.llm import LLM

NO_CUDA_MESSAGE = (
    "carpool bench engine --decode-kernels: no CUDA device here, nothing to time (the engine "
    "on the Triton kernels vs the torch references needs a GPU)."
)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_engine_decode(
    model: str | None = None, batch: int = 32, prompt_len: int = 64, max_tokens: int = 64,
    dtype: str = "bfloat16", device: str = "cuda",
) -> dict[str, float]:
    """Generated tokens/s per path: {"triton": ..., "torch ref": ...}."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    prompts = [[(7 * i + j) % 1000 + 100 for j in range(prompt_len)] for i in range(batch)]
    results: dict[str, float] = {}
    for name, flag in (("triton", True), ("torch ref", False)):
        llm = LLM(model=model, dtype=dtype, device=device, use_triton=flag,
                  max_num_seqs=batch)
        llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
        _sync(device)
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        _sync(device)
        results[name] = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)
        del llm
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return results


def run(model: str | None, dtype: str, batch: int = 32, max_tokens: int = 64) -> int:
    """Print the throughput line; the exit status of the command."""
    if not torch.cuda.is_available():
        print(NO_CUDA_MESSAGE)
        return 0
    try:
        tput = bench_engine_decode(model, batch=batch, max_tokens=max_tokens, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 -- say what failed instead of a traceback
        print(f"engine decode throughput failed: {exc!r}")
        return 1
    print(f"engine decode, {batch} requests x {max_tokens} tokens, tok/s: "
          + ", ".join(f"{k} {v:.0f}" for k, v in tput.items()))
    return 0
