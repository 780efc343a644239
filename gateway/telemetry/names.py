"""Span and attribute names in one place.

``gen_ai.*`` are the OpenTelemetry GenAI semantic-convention names (kept as literals: the
``opentelemetry-semantic-conventions`` module holding them is marked incubating and moves);
``carpool.*`` are ours, for what the conventions do not name.
"""

from __future__ import annotations

# -- GenAI semantic conventions ---------------------------------------------------------------
OPERATION_NAME = "gen_ai.operation.name"  # "chat" | "text_completion"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_TOP_P = "gen_ai.request.top_p"
REQUEST_SEED = "gen_ai.request.seed"
REQUEST_STREAM = "gen_ai.request.stream"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
SERVICE_TIER = "gen_ai.openai.request.service_tier"

PROVIDER = "carpool"

# -- Carpool's own ---------------------------------------------------------------------------
TENANT_ID = "carpool.tenant.id"  # the tenant's id, never its key
TIER = "carpool.tier"
REQUEST_ID = "carpool.request.id"
FINISH_REASON = "carpool.finish_reason"
TTFT_MS = "carpool.ttft_ms"
TTFT_PART_MS = "carpool.ttft.{part}_ms"  # one per part of the TTFT budget (policies.ttft_split)
TTFT_STEPS = "carpool.ttft.steps"  # engine steps from the worker's read to the first token
TTFT_PREFILL_STEPS = "carpool.ttft.prefill_steps"
TPOT_MS = "carpool.tpot_ms"  # mean time per output token after the first
QUEUE_WAIT_MS = "carpool.queue_wait_ms"
E2E_MS = "carpool.e2e_ms"
NUM_PREEMPTIONS = "carpool.num_preemptions"
PREEMPTION_MODE = "carpool.preemption.mode"  # "recompute" | "swap"
ABORT_CAUSE = "carpool.abort.cause"  # client_gone | cancel | timeout | client_stalled | ...
CHUNK_TOKENS = "carpool.prefill.chunk_tokens"
CHUNK_START = "carpool.prefill.chunk_start"
NUM_BLOCKS = "carpool.kv.num_blocks"

# -- span and event names (worker side: children of the gateway's request span) ----------------
SPAN_QUEUE = "carpool.queue"  # enqueue -> taken by a worker
SPAN_ENGINE_WAIT = "carpool.engine.wait"  # added to the engine -> first scheduled
SPAN_PREFILL = "carpool.prefill"  # first scheduled -> first token
SPAN_DECODE = "carpool.decode"  # first token -> finished
EVENT_PREFILL_CHUNK = "carpool.prefill.chunk"
EVENT_PREEMPTION = "carpool.preemption"
EVENT_SWAP_OUT = "carpool.swap.out"
EVENT_SWAP_IN = "carpool.swap.in"
EVENT_ABORT = "carpool.abort"
EVENT_FIRST_TOKEN = "gen_ai.first_token"
