"""The calibrated step-cost profile: measured engine steps, the fit, and its JSON file.

``carpool calibrate`` runs the real engine and hands every step it timed here as
``(rows, tokens, kv_tokens, prefill_rows, constrained_rows, seconds)``; ``fit`` returns the
coefficients of ``engine.sim.cost.StepLaw`` (``base + per_row*rows + per_token*tokens +
per_kv_token*kv_tokens + per_prefill_row*prefill_rows + per_constrained_row*constrained_rows``,
all >= 0; the last is the grammar mask's cost per constrained row), least squares on the *relative* error (each sample
weighted by 1/seconds) so that the many short decode steps, which dominate a serving run, are
fitted as well as the few long prefill steps. The file also records what was measured (model,
its KV shape for the planner, device, CPU) so that a profile is never applied to a different
model unnoticed. Version-1 files (four-field samples, no prefill-row term) and version-2 files
(five fields, no constrained-row term) still load: the missing counts read as 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.sim.cost import CalibratedCost, StepLaw, StepShape
from policies.step_cost import StepCost, nnls

VERSION = 3
# rows, tokens, kv_tokens, prefill_rows, constrained_rows, seconds
Sample = tuple[int, int, int, int, int, float]


@dataclass(frozen=True)
class ModelShape:
    """What seed 004 section 6's KV formula needs: 2 x layers x kv_heads x head_dim x bytes."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    def __post_init__(self) -> None:
        if min(self.layers, self.kv_heads, self.head_dim, self.dtype_bytes) < 1:
            raise ValueError(f"model shape fields must all be >= 1: {self}")

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


SMOLLM2_135M_FP32 = ModelShape(layers=30, kv_heads=3, head_dim=64, dtype_bytes=4)


def fit(samples: Sequence[Sample], trim: float = 0.5) -> StepLaw:
    """Fit, then refit without the steps the first fit missed by more than ``trim`` (relative):
    on a shared machine a few steps stall for another process's time slice, and those
    outliers would drag every coefficient up. A five-field sample (no constrained-row count)
    reads as one with 0."""
    samples = [_sample(x) for x in samples]
    if len(samples) < 6:
        raise ValueError(f"need at least 6 measured steps to fit 6 coefficients, got {len(samples)}")
    data = np.asarray(samples, dtype=float)
    if np.any(data[:, 5] <= 0):
        raise ValueError("measured step times must be > 0")
    cost = _fit(data)
    kept = data[np.asarray(relative_errors(cost, samples)) <= trim]
    return _fit(kept) if len(kept) >= max(6, len(data) // 2) else cost


def _fit(data: np.ndarray) -> StepLaw:
    x = np.column_stack([np.ones(len(data)), data[:, :5]])
    w = 1.0 / data[:, 5]  # relative error: each row scaled so that its target is 1
    coef = nnls(x * w[:, None], np.ones(len(data)))
    return StepLaw(*(float(v) for v in coef))


def relative_errors(cost: StepCost, samples: Sequence[Sample]) -> list[float]:
    law = StepLaw.of(cost)
    samples = [_sample(x) for x in samples]
    return [abs(law.seconds(StepShape(r, t, kv, p, c)) - s) / s for r, t, kv, p, c, s in samples]


@dataclass(frozen=True)
class Profile:
    cost: StepLaw
    model: str
    shape: ModelShape
    block_size: int
    device: str = "cpu"
    cpu: str = ""
    created: str = ""
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cost", StepLaw.of(self.cost))  # a plain StepCost is accepted

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], **meta: Any) -> Profile:
        return cls(fit(samples), samples=[_sample(s) for s in samples], **meta)  # type: ignore[misc]

    def cost_model(self) -> CalibratedCost:
        return CalibratedCost(self.cost)

    def fit_error(self) -> tuple[float, float]:
        """Median and 90th-percentile relative error of the fit on its own samples."""
        errs = sorted(relative_errors(self.cost, self.samples))
        if not errs:
            return math.nan, math.nan
        return errs[len(errs) // 2], errs[min(len(errs) - 1, int(len(errs) * 0.9))]

    def to_json(self) -> dict[str, Any]:
        med, p90 = self.fit_error()
        return {"version": VERSION, "model": self.model, "device": self.device, "cpu": self.cpu,
                "created": self.created, "block_size": self.block_size,
                "model_shape": asdict(self.shape), "coefficients": asdict(self.cost),
                "fit_relative_error": {"median": med, "p90": p90},
                "samples": [list(s) for s in self.samples]}

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        try:
            doc = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ValueError(f"profile {path} not found (run `carpool calibrate` first)") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"profile {path} is not JSON: {e}") from None
        if not isinstance(doc, dict) or doc.get("version") not in (1, 2, VERSION):
            raise ValueError(f"profile {path}: not a version-{VERSION} carpool profile")
        try:
            return cls(StepLaw(**doc["coefficients"]), str(doc["model"]),
                       ModelShape(**doc["model_shape"]), int(doc["block_size"]),
                       str(doc.get("device", "")), str(doc.get("cpu", "")),
                       str(doc.get("created", "")), [_sample(s) for s in doc.get("samples", [])])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"profile {path}: malformed ({e})") from None


def _sample(raw: Sequence[float]) -> Sample:
    """A version-1 sample has no prefill-row count, a version-2 one no constrained-row count:
    0 (the terms it was fitted without)."""
    r, t, k, *pc, s = raw
    if len(pc) > 2:
        raise ValueError(f"a sample has 4 to 6 fields, got {len(raw)}")
    p, c = (list(pc) + [0, 0])[:2]
    return int(r), int(t), int(k), int(p), int(c), float(s)


def default_profile_path(model: str = "SmolLM2-135M-Instruct-Q4_1", device: str = "cpu") -> Path:
    """Where ``carpool calibrate`` writes, and ``simulate``/``plan`` read, by default."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{model}-{device}")
    return Path.home() / ".cache" / "carpool" / "profiles" / f"{safe}.json"
