"""Compiles every Triton kernel for sm_90 (Hopper) ahead of time, no GPU needed: Triton's
front end, its NVIDIA passes and the bundled ptxas. Catches what the interpreter cannot
(loop-carried type changes, constexpr specialisation of ints equal to 1, unsupported ops).

Run as ``python -m tests.kernels.sm90_compile`` with TRITON_INTERPRET unset: under the
interpreter ``triton.jit`` returns functions that cannot be compiled. Prints one line per
variant and exits 1 if any failed.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)


def _signature(fn: Any, types: dict[str, str], consts: dict[str, Any]) -> dict[str, str]:
    sig = {name: types.get(name, "i32") for name in fn.arg_names}
    sig.update({name: "constexpr" for name in consts})
    return sig


def _variants() -> list[tuple[Any, dict[str, str], dict[str, Any], dict[str, int]]]:
    pa = importlib.import_module("kernels.paged_attention")
    rn = importlib.import_module("kernels.rms_norm")
    ro = importlib.import_module("kernels.rotary")
    kv = importlib.import_module("kernels.kv_cache")
    ac = importlib.import_module("kernels.activation")
    attn = {"bt_ptr": "*i32", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32", "part_acc_ptr": "*fp32",
            "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "scale_log2e": "fp32"}
    out: list[tuple[Any, dict[str, str], dict[str, Any], dict[str, int]]] = []
    for dt, bq, g, d, splits, extra in [
        ("bf16", 4, 4, 64, 1, {}),  # SmolLM2 decode
        ("fp16", 16, 1, 128, 4, {}),  # Llama-7B decode, split KV
        ("fp32", 16, 4, 64, 1, {}),  # fp32 (ieee dots)
        ("bf16", 16, 1, 64, 2, {"n_requests": 1, "group": 1, "n_tokens": 1}),  # ints == 1
    ]:
        types = dict(attn, **{n: "*" + dt for n in ("q_ptr", "kc_ptr", "vc_ptr", "out_ptr")})
        consts = {"BLOCK_Q": bq, "G_PAD": g, "D_PAD": d, "TILE_N": 64, "NUM_SPLITS": splits,
                  "DOT_FP32": dt == "fp32", **extra}
        out.append((pa._paged_attention_kernel, types, consts, {"num_warps": 4, "num_stages": 2}))
    out.append((pa._combine_splits_kernel, {"part_acc_ptr": "*fp32", "part_m_ptr": "*fp32",
                "part_l_ptr": "*fp32", "out_ptr": "*bf16"},
                {"NUM_SPLITS": 5, "S_PAD": 8, "D_PAD": 128}, {}))
    out.append((rn._rms_norm_kernel, {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16",
                "out_ptr": "*bf16", "sum_ptr": "*bf16", "eps": "fp32"},
                {"HAS_RESIDUAL": True, "BLOCK": 4096}, {"num_warps": 16}))
    out.append((ro._rotary_kernel, {"pos_ptr": "*i64", "q_ptr": "*bf16", "k_ptr": "*bf16",
                "cs_ptr": "*fp32", "q_out_ptr": "*bf16", "k_out_ptr": "*bf16"},
                {"HQ_PAD": 16, "HK_PAD": 4, "HALF_PAD": 32}, {}))
    out.append((kv._write_kv_kernel, {"k_ptr": "*bf16", "v_ptr": "*bf16", "kc_ptr": "*bf16",
                "vc_ptr": "*bf16", "slot_ptr": "*i64"}, {"H_PAD": 4, "D_PAD": 64}, {}))
    out.append((ac._silu_and_mul_kernel, {"x_ptr": "*bf16", "out_ptr": "*bf16"},
                {"BLOCK": 1024}, {}))
    return out


def main() -> int:
    failed = 0
    for fn, types, consts, options in _variants():
        src = ASTSource(fn=fn, signature=_signature(fn, types, consts), constexprs=consts)
        try:
            triton.compile(src, target=TARGET, options=options)
            print(f"ok   {fn.__name__} {consts}")
        except Exception:  # noqa: BLE001 -- report every variant, then fail
            failed += 1
            print(f"FAIL {fn.__name__} {consts}\n{traceback.format_exc()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
