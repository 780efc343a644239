"""`carpool bench kernels`: the Triton kernels vs their torch references on one GPU.

Per op and shape: time, achieved memory bandwidth (the bytes the op must move at least, over its
time) and that bandwidth as a fraction of the device's peak. Attention is also timed against
``F.scaled_dot_product_attention`` on KV already gathered into contiguous tensors (the gather is
not timed, which flatters SDPA). Decode batches 1/32/256 at context 512 and 4096, on SmolLM2
(9 q heads, 3 KV heads, head dim 64) and a Llama-7B layer (32 heads, head dim 128). Every Triton
result is checked against its reference (max abs error column). The engine's decode
throughput with Triton vs references is an engine benchmark (``carpool bench engine
--decode-kernels``): nothing here imports the engine.

Without CUDA it says so and returns 0. Target from issue #3: paged decode attention at
>= 70% of HBM bandwidth at batch 256, context 4096 on an H100/H200.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

NO_CUDA_MESSAGE = (
    "carpool bench kernels: no CUDA device here, nothing to time. The Triton kernels run on "
    "a GPU; on CPU their tests run under TRITON_INTERPRET=1 (pytest tests/kernels)."
)

# HBM peak (bytes/s) by device-name fragment, most specific first.
PEAK_BANDWIDTH = [
    ("H200", 4.8e12), ("GH200", 4.0e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12), ("H800", 3.35e12), ("B200", 8.0e12), ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12), ("L40S", 0.864e12), ("L40", 0.864e12),
    ("A10G", 0.6e12), ("A10", 0.6e12), ("L4", 0.3e12), ("RTX 4090", 1.008e12),
    ("RTX 3090", 0.936e12), ("V100", 0.9e12), ("T4", 0.32e12),
]


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int


SMOLLM2 = ModelShape("SmolLM2-135M", 9, 3, 64, 576, 1536)
LLAMA7B = ModelShape("Llama-7B", 32, 32, 128, 4096, 11008)


@dataclass
class Row:
    op: str
    shape: str
    impl: str
    ms: float
    bytes_moved: float
    max_err: float | None = None

    def gbps(self) -> float:
        return self.bytes_moved / (self.ms * 1e-3) / 1e9


def peak_bandwidth(device: torch.device) -> tuple[float, str]:
    """(bytes/s, where the number came from)."""
    props = torch.cuda.get_device_properties(device)
    for fragment, peak in PEAK_BANDWIDTH:
        if fragment in props.name:
            return peak, f"datasheet for {fragment}"
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8, "memory clock x bus width"
    return float("nan"), "unknown device"


def time_ms(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def _decode_batch(shape: ModelShape, batch: int, ctx: int, dtype: torch.dtype,
                  dev: torch.device, block_size: int = 16) -> dict[str, Any]:
    """A decode step: one query token per request, blocks scattered over the cache."""
    per_req = -(-ctx // block_size)
    num_blocks = batch * per_req
    tables = torch.randperm(num_blocks, device=dev, dtype=torch.int32).view(batch, per_req)
    cache_shape = (num_blocks, block_size, shape.num_kv_heads, shape.head_dim)
    return {
        "q": torch.randn(batch, shape.num_heads, shape.head_dim, device=dev, dtype=dtype),
        "k_cache": torch.randn(cache_shape, device=dev, dtype=dtype),
        "v_cache": torch.randn(cache_shape, device=dev, dtype=dtype),
        "block_tables": tables,
        "seq_lens": torch.full((batch,), ctx, device=dev, dtype=torch.int32),
        "query_start_loc": torch.arange(batch + 1, device=dev, dtype=torch.int32),
        "scale": shape.head_dim ** -0.5,
    }


def bench_attention(shape: ModelShape, batch: int, ctx: int, dtype: torch.dtype,
                    dev: torch.device) -> list[Row]:
    from kernels.paged_attention import paged_attention_ref, paged_attention_triton

    a = _decode_batch(shape, batch, ctx, dtype, dev)
    elem = a["q"].element_size()
    kv_bytes = 2 * batch * ctx * shape.num_kv_heads * shape.head_dim * elem
    moved = kv_bytes + 2 * a["q"].numel() * elem
    label = f"{shape.name} b={batch} ctx={ctx}"
    ref = paged_attention_ref(**a)
    err = _max_err(paged_attention_triton(**a), ref)
    rows = [
        Row("paged_attention", label, "triton", time_ms(lambda: paged_attention_triton(**a)),
            moved, err),
        Row("paged_attention", label, "torch ref", time_ms(lambda: paged_attention_ref(**a)),
            moved),
    ]
    # SDPA on contiguous KV [B, Hk, ctx, D]; GQA handled by SDPA itself.
    tables = a["block_tables"].long()
    k = a["k_cache"][tables].flatten(1, 2)[:, :ctx].transpose(1, 2).contiguous()
    v = a["v_cache"][tables].flatten(1, 2)[:, :ctx].transpose(1, 2).contiguous()
    q = a["q"].unsqueeze(2)
    gqa = shape.num_heads != shape.num_kv_heads

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, scale=a["scale"], enable_gqa=gqa)

    sdpa_err = _max_err(sdpa().squeeze(2), ref)
    rows.append(Row("paged_attention", label, "SDPA gathered", time_ms(sdpa), moved, sdpa_err))
    return rows


def _pair(op: str, label: str, moved: float, triton_fn: Callable[[], Any],
          ref_fn: Callable[[], Any]) -> list[Row]:
    out, ref = triton_fn(), ref_fn()
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    err = max(_max_err(o, r) for o, r in zip(outs, refs))
    return [Row(op, label, "triton", time_ms(triton_fn), moved, err),
            Row(op, label, "torch ref", time_ms(ref_fn), moved)]


def _write_then(write: Callable[..., None], k: torch.Tensor, v: torch.Tensor,
                kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor) -> tuple[Any, ...]:
    """Runs a cache write and returns the caches, so _pair can compare the two writes."""
    write(k, v, kc, vc, slots)
    return kc, vc


def bench_pointwise(shape: ModelShape, tokens: int, dtype: torch.dtype,
                    dev: torch.device) -> list[Row]:
    from kernels.activation import silu_and_mul_ref, silu_and_mul_triton
    from kernels.kv_cache import write_kv_cache_ref, write_kv_cache_triton
    from kernels.rms_norm import (
        fused_add_rms_norm_ref,
        fused_add_rms_norm_triton,
        rms_norm_ref,
        rms_norm_triton,
    )
    from kernels.rotary import rope_cos_sin, rotary_embedding_ref, rotary_embedding_triton

    label = f"{shape.name} T={tokens}"
    elem = torch.empty((), dtype=dtype).element_size()
    h, hq, hk, d = shape.hidden, shape.num_heads, shape.num_kv_heads, shape.head_dim
    x = torch.randn(tokens, h, device=dev, dtype=dtype)
    res = torch.randn_like(x)
    w = torch.randn(h, device=dev, dtype=dtype)
    gate_up = torch.randn(tokens, 2 * shape.intermediate, device=dev, dtype=dtype)
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, device=dev, dtype=dtype)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(tokens, hk, d)
    v = qkv[:, (hq + hk) * d :].view(tokens, hk, d)
    table = rope_cos_sin(d, 8192, 10000.0, device=dev)
    pos = torch.randint(0, 8192, (tokens,), device=dev)
    block_size = 16
    n_blocks = -(-tokens // block_size) + 1
    kc = torch.zeros(n_blocks, block_size, hk, d, device=dev, dtype=dtype)
    vc, kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(kc), torch.zeros_like(kc)
    slots = torch.randperm(n_blocks * block_size, device=dev)[:tokens]
    rows = _pair("rms_norm", label, 2 * x.numel() * elem,
                 lambda: rms_norm_triton(x, w, 1e-6),
                 lambda: rms_norm_ref(x, w, 1e-6))
    rows += _pair("fused_add_rms_norm", label, 4 * x.numel() * elem,
                  lambda: fused_add_rms_norm_triton(x, res, w, 1e-6),
                  lambda: fused_add_rms_norm_ref(x, res, w, 1e-6))
    rows += _pair("rotary_embedding", label, 2 * (q.numel() + k.numel()) * elem,
                  lambda: rotary_embedding_triton(pos, q, k, table),
                  lambda: rotary_embedding_ref(pos, q, k, table))
    rows += _pair("silu_and_mul", label, 1.5 * gate_up.numel() * elem,
                  lambda: silu_and_mul_triton(gate_up),
                  lambda: silu_and_mul_ref(gate_up))
    rows += _pair("write_kv_cache", label, 4 * k.numel() * elem,
                  lambda: _write_then(write_kv_cache_triton, k, v, kc, vc, slots),
                  lambda: _write_then(write_kv_cache_ref, k, v, kc2, vc2, slots))
    return rows


def print_rows(rows: list[Row], peak: float) -> None:
    print(f"{'op':<19} {'shape':<28} {'impl':<14} {'time us':>10} {'GB/s':>8} "
          f"{'% peak':>7} {'max err':>9}")
    for r in rows:
        err = f"{r.max_err:.1e}" if r.max_err is not None else ""
        print(f"{r.op:<19} {r.shape:<28} {r.impl:<14} {r.ms * 1e3:>10.1f} {r.gbps():>8.0f} "
              f"{100 * r.gbps() * 1e9 / peak:>6.1f}% {err:>9}")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="carpool bench kernels", description=__doc__.split("\n")[0])
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--tokens", type=int, nargs="+", default=[32, 256, 4096],
                   help="token counts for the pointwise ops")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if not torch.cuda.is_available():
        print(NO_CUDA_MESSAGE)
        return 0
    dtype = getattr(torch, args.dtype)
    dev = torch.device("cuda")
    peak, source = peak_bandwidth(dev)
    print(f"{torch.cuda.get_device_name(dev)}: peak HBM {peak / 1e12:.2f} TB/s ({source}), "
          f"dtype {args.dtype}")
    rows: list[Row] = []
    for shape in (SMOLLM2, LLAMA7B):
        for batch in args.batches:
            for ctx in args.contexts:
                rows += bench_attention(shape, batch, ctx, dtype, dev)
                torch.cuda.empty_cache()  # the big cases hold tens of GB
        for tokens in args.tokens:
            rows += bench_pointwise(shape, tokens, dtype, dev)
    print_rows(rows, peak)
    return 0
