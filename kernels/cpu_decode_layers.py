"""A small step's whole decoder stack on CPU fp32 in one C++ call: every layer's norms,
linears, rotary, KV write, decode attention and SiLU-mul, then the final norm.

Why: at 1-8 decoding rows a step is ~120 linears that stream the weights (~17 ms for SmolLM2 on
2 cores) and ~240 tiny ops between them. Called from Python, each op cost 5-15 us of
interpreter, pybind and dispatch: ~3-4 ms a step, a fifth of one stream's token time. Here the
same ops run back to back in C++ with the GIL released, so the event loop relays tokens
meanwhile.

How: one extension compiled from the three ops' own sources (``kernels.cpu_small_linear``,
``kernels.cpu_decode``, ``kernels.cpu_layer_ops``), each in a namespace of its own, plus a
driver that calls their entry points in ``engine.models.cpu_decode_step.layer_forward``'s
order. The layer ops keep their build's ``-ffp-contract=off`` through ``#pragma GCC optimize``
around their namespace (their rotary matches the torch reference bit for bit); the others keep
the default contraction, as in their own builds. So a step gives the same bits as the
per-op path (tests/kernels/test_cpu_decode_layers.py compares them).
The small linears here run on this extension's own copy of the pool (the LM head's call, after
the stack, wakes the standalone op's pool): the stack's last linear tells its worker to sleep at
once, so it does not spin through the head (the head's worker may still spin into the next
step's start).

Contract: ``DecodeLayers(layers, final_norm, ...)`` binds a stack to its weights (each linear as
the small-batch op packs it, fp32 or int8 with its scales; raises when the op is not built;
``engine.models.cpu_decode_step.stack_for`` binds the model's). ``forward(x [R, H], step,
kv_caches)`` takes the embedded tokens of a step of at most ``MAX_TOKENS`` tokens and the step's
prepared metadata (``engine.models.cpu_decode_step.CpuDecodeStep``: one attention row a token,
so a prompt token attends as a decode row of its own) and returns the final-norm hidden states
[R, H], writing each layer's new K and V into its cache, exactly as the model's forward would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from kernels import cpu_decode, cpu_layer_ops, cpu_small_linear
from kernels.cpu_ext import FLAGS, CppOps


class StepRows(Protocol):
    """A step's attention rows, one a token, as ``forward`` reads them (the engine's prepared
    step, ``engine.models.cpu_decode_step.CpuDecodeStep``, is one)."""

    @property
    def positions(self) -> torch.Tensor: ...  # [R] int64
    @property
    def slots(self) -> torch.Tensor: ...  # [R] int64: cache slot of each new token
    @property
    def block_tables(self) -> torch.Tensor: ...  # [R, max_blocks] int32
    @property
    def seq_lens(self) -> torch.Tensor: ...  # [R] int32: context length incl. the token


# Steps of up to this many tokens run here, their linears on the small-batch op at any row
# count up to it. Past the small op's own routing limit (cpu_small_linear.MAX_ROWS, set for
# linears called one by one between OpenMP regions) the stack still wins, because nothing in
# it wakes a sleeping thread: decode steps on 2 AVX2 cores (step_profile, whole step), stack
# against the per-op path: 48 rows 127 vs 163 ms, 64 rows 156 vs 178, 96 rows 221 vs 238,
# 128 rows 330 vs 318 (there the small op's re-reads of a step's rows, past L2, cost more).
MAX_TOKENS = 96

# Every header the three sources include, outside any namespace: their own #include lines,
# inside the namespaces below, then find them already included.
_PRELUDE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cmath>
#include <exception>
#include <memory>
#include <thread>
#include <vector>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
"""

_DRIVER = r"""
struct Layer {
  torch::Tensor norm1, norm2;
  double eps1, eps2;
  // the four linears: qkv, o, gate_up, down (packed [ceil(N/32), K, 32], bias or undefined,
  // int8 weights' scale [N] or undefined for fp32 ones)
  torch::Tensor w[4], b[4], s[4];
  int64_t n[4];
};

static c10::optional<torch::Tensor> maybe(const torch::Tensor& t) {
  return t.defined() ? c10::optional<torch::Tensor>(t) : c10::nullopt;
}

class DecodeLayers {
 public:
  // per layer, in order: norm1, qkv, qkv bias, o, o bias, norm2, gate_up, gate_up bias, down,
  // down bias (a bias may be None); eps: (eps1, eps2) a layer; out: the four N a layer;
  // scales: the four linears' int8 scales a layer (None: fp32 weights)
  DecodeLayers(std::vector<c10::optional<torch::Tensor>> tensors, std::vector<double> eps,
               std::vector<int64_t> out, std::vector<c10::optional<torch::Tensor>> scales,
               torch::Tensor final_norm, double final_eps,
               torch::Tensor cos_sin, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
               double scale)
      : final_norm_(final_norm), final_eps_(final_eps), cos_sin_(cos_sin.contiguous()),
        hq_(q_heads), hk_(kv_heads), d_(head_dim), scale_(scale) {
    const size_t L = eps.size() / 2;
    TORCH_CHECK(eps.size() == 2 * L && tensors.size() == 10 * L && out.size() == 4 * L &&
                scales.size() == 4 * L && L > 0,
                "DecodeLayers: 10 tensors, 2 eps, 4 sizes and 4 scales a layer");
    for (size_t i = 0; i < L; ++i) {
      auto t = [&](size_t j) { return tensors[10 * i + j].value_or(torch::Tensor()); };
      Layer l;
      l.norm1 = t(0); l.norm2 = t(5);
      l.eps1 = eps[2 * i]; l.eps2 = eps[2 * i + 1];
      const size_t at[4] = {1, 3, 6, 8};
      for (int k = 0; k < 4; ++k) {
        l.w[k] = t(at[k]); l.b[k] = t(at[k] + 1); l.n[k] = out[4 * i + k];
        l.s[k] = scales[4 * i + k].value_or(torch::Tensor());
        TORCH_CHECK(l.w[k].defined() && l.w[k].dim() == 3, "DecodeLayers: packed weights");
        TORCH_CHECK(l.s[k].defined() == (l.w[k].dtype() == torch::kChar),
                    "DecodeLayers: a scale for int8 weights only");
      }
      TORCH_CHECK(l.norm1.defined() && l.norm2.defined(), "DecodeLayers: norm weights");
      layers_.push_back(l);
    }
  }

  torch::Tensor forward(torch::Tensor x, torch::Tensor positions, torch::Tensor slots,
                        torch::Tensor block_tables, torch::Tensor seq_lens,
                        std::vector<torch::Tensor> k_caches, std::vector<torch::Tensor> v_caches) {
    TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(),
                "DecodeLayers: one K and one V cache a layer");
    const int64_t t = x.size(0);
    torch::Tensor residual;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      const bool last = i + 1 == layers_.size();
      torch::Tensor h;
      if (!residual.defined()) {
        h = layer_ops::rms_norm(x, l.norm1, l.eps1);
        residual = x;
      } else {
        auto hr = layer_ops::add_rms_norm(x, residual, l.norm1, l.eps1);
        h = hr[0];
        residual = hr[1];
      }
      auto qkv = linear(h, l, 0, false).view({t, hq_ + 2 * hk_, d_});
      auto qk = layer_ops::rotary(positions, qkv.narrow(1, 0, hq_), qkv.narrow(1, hq_, hk_),
                                  cos_sin_);
      layer_ops::write_kv(qk[1], qkv.narrow(1, hq_ + hk_, hk_), k_caches[i], v_caches[i], slots);
      auto o = decode::paged_decode(qk[0], k_caches[i], v_caches[i], block_tables, seq_lens,
                                    scale_);
      auto hr = layer_ops::add_rms_norm(linear(o.reshape({t, hq_ * d_}), l, 1, false), residual,
                                        l.norm2, l.eps2);
      residual = hr[1];
      x = linear(layer_ops::silu_mul(linear(hr[0], l, 2, false)), l, 3, last);
    }
    small_linear::SerialLoops serial;  // the workers sleep since the last linear: keep it so
    return layer_ops::add_rms_norm(x, residual, final_norm_, final_eps_)[0];
  }

 private:
  // Every op of the stack runs on this pool, so its workers spin between them at any row
  // count (no OpenMP region wants their core, and no linear pays a futex wake). The last
  // linear lets them sleep at once: the LM head that follows runs on the standalone op's pool,
  // and a worker spinning here would take its core.
  static torch::Tensor linear(const torch::Tensor& x, const Layer& l, int k, bool last) {
    if (l.s[k].defined())
      return small_linear::linear_int8_on_pool(x, l.w[k], l.s[k], maybe(l.b[k]), l.n[k], !last);
    return small_linear::linear_on_pool(x, l.w[k], maybe(l.b[k]), l.n[k], !last);
  }

  std::vector<Layer> layers_;
  torch::Tensor final_norm_;
  double final_eps_;
  torch::Tensor cos_sin_;
  int64_t hq_, hk_, d_;
  double scale_;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<DecodeLayers>(m, "DecodeLayers")
      .def(py::init<std::vector<c10::optional<torch::Tensor>>, std::vector<double>,
                    std::vector<int64_t>, std::vector<c10::optional<torch::Tensor>>,
                    torch::Tensor, double, torch::Tensor, int64_t, int64_t, int64_t, double>())
      // no Python object is touched inside: the event loop runs while the stack does
      .def("forward", &DecodeLayers::forward, py::call_guard<py::gil_scoped_release>());
}
"""


def _source() -> str:
    parts = [
        _PRELUDE,
        "namespace small_linear {", cpu_small_linear.OPS.source, "}  // namespace small_linear",
        # the layer ops' and attention's parallel loops run on the linears' pool, not OpenMP
        "#define CP_PARALLEL_FOR small_linear::pool_parallel_for",
        "namespace decode {", cpu_decode.OPS.source, "}  // namespace decode",
        # the layer ops' own build has -ffp-contract=off: keep it for their functions only
        "#pragma GCC push_options", '#pragma GCC optimize("fp-contract=off")',
        "namespace layer_ops {", cpu_layer_ops.OPS.source, "}  // namespace layer_ops",
        "#pragma GCC pop_options",
        _DRIVER,
    ]
    return "\n".join(parts)


# no function list: the source binds its own class (PYBIND11_MODULE above)
OPS = CppOps("carpool_cpu_decode_layers", _source(), (), FLAGS)


def available() -> bool:
    return OPS.available()


@dataclass(frozen=True)
class SmallLinear:
    """One linear as the small-batch op holds it (``kernels.cpu_linear.OneDNNLinear.small``)."""

    packed: torch.Tensor  # [ceil(N/32), K, 32], fp32 or int8
    bias: torch.Tensor | None
    out_features: int
    scale: torch.Tensor | None = None  # [N]: int8 weights' scales (kernels.cpu_int8_linear)


@dataclass(frozen=True)
class LayerWeights:
    norm1: torch.Tensor
    eps1: float
    qkv: SmallLinear
    o: SmallLinear
    norm2: torch.Tensor
    eps2: float
    gate_up: SmallLinear
    down: SmallLinear


class DecodeLayers:
    """A decoder stack bound once to its weights (no copies: the tensors given are held)."""

    def __init__(self, layers: Sequence[LayerWeights], final_norm: torch.Tensor,
                 final_eps: float, cos_sin: torch.Tensor, q_heads: int, kv_heads: int,
                 head_dim: int, scale: float) -> None:
        module = OPS.module()
        if module is None:
            raise RuntimeError(f"{OPS.name} is not built (python -m kernels.build_ops cpu_decode_layers)")
        tensors: list[torch.Tensor | None] = []
        eps: list[float] = []
        out: list[int] = []
        scales: list[torch.Tensor | None] = []
        for w in layers:
            for part in (w.norm1, w.qkv, w.o, w.norm2, w.gate_up, w.down):
                if isinstance(part, SmallLinear):
                    tensors += [part.packed, part.bias]
                    out.append(part.out_features)
                    scales.append(part.scale)
                else:
                    tensors.append(part.contiguous())
            eps += [w.eps1, w.eps2]
        self._stack = module.DecodeLayers(tensors, eps, out, scales, final_norm.contiguous(),
                                          final_eps, cos_sin, q_heads, kv_heads, head_dim, scale)

    def forward(self, x: torch.Tensor, step: StepRows,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        out: torch.Tensor = self._stack.forward(
            x, step.positions, step.slots, step.block_tables, step.seq_lens,
            [k for k, _ in kv_caches], [v for _, v in kv_caches])
        return out

