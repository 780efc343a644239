"""Owns the model, the paged KV cache (device pool + CPU swap pool) and the sampler.

``execute(out)`` does one step in the order the scheduler promised: swap-out copies, the prefix
cache's partial-block copies, swap-in copies, then one flattened forward over every scheduled
token, logits only for the rows that sample, and sampling. The KV cache is one tensor ``[layers,
2, num_blocks, block_size, kv_heads, head_dim]``; layer i's (k, v) are views into it, so a swap
of a block across all layers is a single indexed copy.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from engine.core.config import CacheConfig, EngineConfig, ModelConfig
from engine.core.outputs import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from engine.core.sampling_params import SamplingParams
from engine.models.llama import LlamaForCausalLM
from engine.models.llama_layers import LlamaArgs
from engine.runner.grammar_mask import apply_grammar_mask, constrained_rows
from engine.runner.inputs import StepInputs, build_inputs
from engine.runner.loader import (
    eos_token_ids,
    load_hf_config,
    load_state_dict,
    load_tokenizer,
    model_name,
    resolve_model_dir,
)
from engine.runner.quantize import quantize_int8
from engine.runner.sampler import Sampler
from engine.structured.compiler import GrammarCompiler
from engine.structured.rows import GrammarRows
from kernels import greedy_head
from kernels.cpu_linear import route_cpu_linears

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
GIB = 1 << 30
_PAD_PARAMS = SamplingParams(max_tokens=1)


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        num_blocks: int | None = None,
        num_cpu_blocks: int | None = None,
        sampler_seed: int | None = None,
        use_triton: bool | None = None,
    ) -> None:
        """``num_blocks``/``num_cpu_blocks`` override the cache config; when both are None the
        pools are sized from ``kv_cache_memory_gb`` / ``swap_space_gb``. ``use_triton``
        forces the model's kernel path (None: by device)."""
        _set_threads()
        self.device = torch.device(model_config.device)
        self.dtype = DTYPES[model_config.dtype]
        self.kv_dtype = (self.dtype if cache_config.kv_cache_dtype == "auto"
                         else DTYPES[cache_config.kv_cache_dtype])
        self.model_dir = resolve_model_dir(model_config.model, model_config.cache_dir)
        self.model_name = model_name(self.model_dir)
        hf_config = load_hf_config(self.model_dir)
        self.tokenizer: Any = load_tokenizer(self.model_dir)
        self.eos_token_ids = eos_token_ids(self.model_dir, self.tokenizer, hf_config)
        self.eos_token_id: int | None = self.eos_token_ids[0] if self.eos_token_ids else None
        self.args = LlamaArgs.from_hf(hf_config)
        self.max_model_len = _max_model_len(self.args, model_config.max_model_len)
        state = load_state_dict(self.model_dir, self.dtype)
        state = {k: v.to(self.device) for k, v in state.items()}
        self.model = LlamaForCausalLM.from_state_dict(
            self.args, state, self.max_model_len, use_triton
        )
        if model_config.quantization == "int8":
            quantize_int8(self.model)
        route_cpu_linears(self.model)  # fp32 CPU linears -> oneDNN; others keep F.linear
        self.block_size = cache_config.block_size
        self.num_blocks = _pick(num_blocks, cache_config.num_blocks,
                                cache_config.kv_cache_memory_gb, self.bytes_per_block)
        self.num_cpu_blocks = _pick(num_cpu_blocks, cache_config.num_cpu_blocks,
                                    cache_config.swap_space_gb, self.bytes_per_block)
        # One block past the scheduler's pool is scratch for padding rows: never allocated.
        self.padding_block = self.num_blocks
        shape = (self.args.num_layers, 2, self.num_blocks + 1, self.block_size,
                 self.args.num_kv_heads, self.args.head_dim)
        # zeros, not empty: kernels may read (masked) past a sequence's end; never NaN garbage
        self.kv_cache = torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
        self.cpu_cache = torch.zeros((*shape[:2], self.num_cpu_blocks, *shape[3:]),
                                     dtype=self.kv_dtype, pin_memory=self.device.type == "cuda")
        self.kv_caches = [(self.kv_cache[i, 0], self.kv_cache[i, 1])
                          for i in range(self.args.num_layers)]
        self.sampler = Sampler(sampler_seed)
        # structured outputs: compiled grammars (built lazily; nothing until a request has
        # one) and each constrained sequence's parser
        self.grammars = GrammarCompiler(self.tokenizer, self.eos_token_ids)
        self.grammar_rows = GrammarRows(self.grammars)

    @classmethod
    def from_config(cls, config: EngineConfig) -> ModelRunner:
        return cls(config.model, config.cache, use_triton=config.use_triton)

    @property
    def bytes_per_block(self) -> int:
        a = self.args
        elem = torch.empty((), dtype=self.kv_dtype).element_size()
        return a.num_layers * 2 * self.block_size * a.num_kv_heads * a.head_dim * elem

    def cache_summary(self) -> str:
        """The KV pools in one line, as a server says at start-up (vLLM's "# GPU blocks" and
        "maximum concurrency"): what an operator sizes ``--max-num-seqs`` and the
        prompts against. The scratch padding block is not counted."""
        tokens = self.num_blocks * self.block_size
        mib = self.num_blocks * self.bytes_per_block / (1 << 20)
        dtype = str(self.kv_dtype).removeprefix("torch.")
        return (f"KV cache: {self.num_blocks} blocks of {self.block_size} tokens = {tokens} "
                f"tokens ({mib:.1f} MiB {dtype} on {self.device.type}), swap {self.num_cpu_blocks}"
                f" blocks; {tokens / self.max_model_len:.2f}x concurrency at the full "
                f"{self.max_model_len}-token context")

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Swap out, copy partial prefix blocks, swap in, then forward and sample."""
        with torch.inference_mode():
            if out.finished_ids and self.grammar_rows.states:
                self.grammar_rows.free(out.finished_ids)
            if out.swap_out:
                self.swap_out(out.swap_out)
            if out.copies:
                self.copy_blocks(out.copies)
            if out.swap_in:
                self.swap_in(out.swap_in)
            if not out.scheduled:
                return ModelRunnerOutput()
            step = self.prepare_inputs(out.scheduled, out.num_padding_rows)
            hidden = self.model(step.input_ids, step.positions, self.kv_caches, step.meta)
            if not step.sample_rows:
                return ModelRunnerOutput()
            # a pure decode step samples every row: the hidden rows are the logits rows
            last = hidden if step.samples_every_token else hidden[step.logits_indices]
            rows = step.sample_rows
            tokens = self._plain_greedy(last, rows)
            if tokens is not None:
                return ModelRunnerOutput({s.request_id: t for s, t in zip(rows, tokens)}, {})
            constrained = constrained_rows(rows)
            if constrained:
                return self._sample_constrained(last, rows)
            tokens, logprobs = self._sample(last, rows, [])
        return ModelRunnerOutput({s.request_id: t for s, t in zip(rows, tokens)},
                                 {rows[r].request_id: lp for r, lp in logprobs.items()})

    def _sample(self, last: torch.Tensor, rows: list[ScheduledRequest], constrained: list[int]
                ) -> tuple[list[int], dict[int, Any]]:
        """Logits, the grammar mask of the ``constrained`` rows, the processors and sampling:
        each row's token and the logprobs of the rows that ask (by row)."""
        logits = self.model.compute_logits(last)
        if constrained:
            logits = apply_grammar_mask(logits, rows, constrained, self.grammar_rows)
        sampled = self.sampler.sample_batch(
            logits[: len(rows)],  # padding rows' logits are discarded
            [s.sampling_params for s in rows],
            [s.output_index for s in rows],
            [s.history for s in rows],
            [s.eos_token_id for s in rows],
        )
        for r in constrained:
            self.grammar_rows.advance(rows[r].request_id, sampled.tokens[r])
        return sampled.tokens, sampled.logprobs

    def _sample_constrained(self, last: torch.Tensor,
                            rows: list[ScheduledRequest]) -> ModelRunnerOutput:
        """A step with grammar rows. Its plain greedy rows still take the greedy head (they
        pay nothing for their neighbours' constraint), and so do its greedy grammar rows
        first: when the free argmax is a token the grammar allows, it is the constrained
        argmax too, and the row needs neither its mask nor its full logits. The rest (rows
        that sample, ask for logprobs or process logits, and greedy grammar rows whose free
        argmax the grammar refuses) go through ``_sample`` with their masks."""
        head = [i for i, s in enumerate(rows) if _greedy_head(s.sampling_params)]
        fast = (self.model.greedy_tokens(last[head])
                if head and len(head) <= greedy_head.MAX_ROWS else None)
        out: dict[str, int] = {}
        taken: set[int] = set()
        for i, token in zip(head, fast or []):
            s = rows[i]
            if s.sampling_params.structured is None:
                out[s.request_id] = token
            elif not self.grammar_rows.allows(s, token):
                continue
            else:
                out[s.request_id] = token
                self.grammar_rows.advance(s.request_id, token)
            taken.add(i)
        other = [i for i in range(len(rows)) if i not in taken]
        if not other:
            return ModelRunnerOutput(out, {})
        sub = [rows[i] for i in other]
        tokens, logprobs = self._sample(last[other], sub, constrained_rows(sub))
        out.update((rows[i].request_id, t) for i, t in zip(other, tokens))
        return ModelRunnerOutput(out, {sub[r].request_id: lp for r, lp in logprobs.items()})

    def _plain_greedy(self, last: torch.Tensor,
                      rows: list[ScheduledRequest]) -> list[int] | None:
        """The rows' tokens when every row is plain greedy (no logits processor, no
        logprobs): the argmax of their logits, which the head may find without computing
        them all (``LlamaForCausalLM.greedy_tokens``). None: sample from the logits.
        A fixed-shape batch's padding rows (after ``rows`` in ``last``) go through the head
        too, so a seat costs the same whether its request still runs or not."""
        if len(last) > greedy_head.MAX_ROWS:  # a big batch: no per-row look at its params
            return None
        if not all(_plain(s.sampling_params) for s in rows):
            return None
        tokens = self.model.greedy_tokens(last)
        return None if tokens is None else tokens[: len(rows)]

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """(device_block, cpu_block) pairs: copy every layer's K and V to the CPU pool."""
        src, dst = zip(*pairs, strict=True)
        blocks = self.kv_cache[:, :, torch.tensor(src, device=self.device)]
        self.cpu_cache[:, :, torch.tensor(dst)] = blocks.to("cpu")

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """(source, destination) device blocks: every layer's K and V; all sources are read
        before any destination is written."""
        src, dst = zip(*pairs, strict=True)
        blocks = self.kv_cache[:, :, torch.tensor(src, device=self.device)]
        self.kv_cache[:, :, torch.tensor(dst, device=self.device)] = blocks

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """(cpu_block, device_block) pairs: copy back from the CPU pool."""
        src, dst = zip(*pairs, strict=True)
        blocks = self.cpu_cache[:, :, torch.tensor(src)].to(self.device)
        self.kv_cache[:, :, torch.tensor(dst, device=self.device)] = blocks

    def _padding_row(self, scheduled: list[ScheduledRequest]) -> ScheduledRequest:
        ctx = max((s.start_pos + len(s.token_ids) for s in scheduled), default=1)
        blocks = [self.padding_block] * -(-ctx // self.block_size)
        return ScheduledRequest("", [0], ctx - 1, blocks, True, _PAD_PARAMS, 0)

    def prepare_inputs(
        self, scheduled: list[ScheduledRequest], num_padding_rows: int = 0
    ) -> StepInputs:
        """Flatten the step into index tensors (``engine.runner.inputs``).

        ``num_padding_rows`` dummy decode rows (a fixed-shape batch's finished seats) go last,
        with logits rows after the real ones. Like a padded ``generate`` row, each attends over
        the batch's longest context, here the scratch block read over and over, so a seat
        costs the same whether its request is still running or not.
        """
        pad = [self._padding_row(scheduled)] * num_padding_rows if num_padding_rows else None
        return build_inputs(scheduled, self.block_size, self.device, pad)


def _plain(p: SamplingParams) -> bool:
    """Plain greedy: the argmax of the raw logits is the token."""
    return (p.greedy and not p.processes_logits and p.logprobs is None
            and p.structured is None)


def _greedy_head(p: SamplingParams) -> bool:
    """Greedy and nothing but (a grammar aside): the greedy head's token may be the answer."""
    return (p.greedy and not p.processes_logits and p.logprobs is None)


def _pick(explicit: int | None, configured: int | None, budget_gb: float, per_block: int) -> int:
    if explicit is not None:
        return explicit
    if configured is not None:
        return configured
    return int(budget_gb * GIB // per_block)


def _max_model_len(a: LlamaArgs, requested: int | None) -> int:
    limit = a.max_position_embeddings
    if a.sliding_window is not None:
        # we attend to the full context; it is exact only while it fits in the window
        limit = min(limit, a.sliding_window)
    if requested is not None and requested > limit:
        raise ValueError(f"max_model_len {requested} exceeds the model's limit {limit}")
    return requested if requested is not None else limit


def _set_threads() -> None:
    # Use every core we are allowed on, once; intra-op parallelism is what the matmuls need.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cores and torch.get_num_threads() != cores:
        torch.set_num_threads(cores)
