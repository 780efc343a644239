"""How far a quantized engine is from fp32: top-1 agreement and perplexity over a fixed text set.

Each text runs teacher-forced through both engines' models in one prefill (the runner's own
paged path, every position's logits): top-1 agreement is the share of positions where both
pick the same next token; perplexity is exp(mean cross-entropy of the text's next tokens).
``carpool bench engine --quantization int8`` prints it; tests compare it with transformers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.core.outputs import ScheduledRequest
from engine.core.sampling_params import SamplingParams
from engine.llm_engine import LLMEngine

TEXTS = (
    "The quick brown fox jumps over the lazy dog while the farmer watches from the barn.",
    ("Photosynthesis is the process by which green plants use sunlight to make food from "
     "carbon dioxide and water."),
    "In 1969, astronauts landed on the Moon for the first time and walked on its surface.",
    "To make bread, mix flour, water, salt and yeast, knead the dough, let it rise, and bake.",
    "The capital of France is Paris, a city known for its museums, cafes and the Eiffel Tower.",
    "Water boils at one hundred degrees Celsius at sea level and freezes at zero degrees.",
    "A good night's sleep helps the body recover and the mind store what it learned that day.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
)


@dataclass
class Quality:
    positions: int
    agreement: float  # share of positions with the same argmax
    ppl_ref: float
    ppl: float

    def line(self, name: str) -> str:
        return (f"{name} vs fp32 over {len(TEXTS)} texts ({self.positions} positions): top-1 "
                f"agreement {100 * self.agreement:.1f}%, perplexity {self.ppl:.3f} vs "
                f"{self.ppl_ref:.3f} (delta {self.ppl - self.ppl_ref:+.3f}, "
                f"{100 * (self.ppl / self.ppl_ref - 1):+.1f}%)")


def all_logits(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] logits of a fresh prefill of ``ids`` through the engine's runner."""
    runner = engine.runner
    blocks = list(range(-(-len(ids) // runner.block_size)))
    sched = ScheduledRequest("quality", ids, 0, blocks, True, SamplingParams(max_tokens=1), 0)
    with torch.inference_mode():
        step = runner.prepare_inputs([sched])
        hidden = runner.model(step.input_ids, step.positions, runner.kv_caches, step.meta)
        return runner.model.compute_logits(hidden).double()


def compare(ref: LLMEngine, other: LLMEngine, texts: tuple[str, ...] = TEXTS) -> Quality:
    same = total = 0
    nll_ref = nll = 0.0
    for text in texts:
        ids = list(ref.tokenizer.encode(text, add_special_tokens=False))
        a, b = all_logits(ref, ids)[:-1], all_logits(other, ids)[:-1]
        target = torch.tensor(ids[1:])
        same += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += len(ids) - 1
        nll_ref += float(F.cross_entropy(a, target, reduction="sum"))
        nll += float(F.cross_entropy(b, target, reduction="sum"))
    return Quality(total, same / total, math.exp(nll_ref / total), math.exp(nll / total))
