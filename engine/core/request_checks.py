"""Pure checks on a request: can it ever run, and did its last token finish it. Torch-free."""

from __future__ import annotations

from engine.core.block_manager import cdiv
from engine.core.config import SchedulerConfig
from engine.core.request import Request, RequestStatus


def invalid_prompt_reason(token_ids: list[int], vocab_size: int) -> str | None:
    """Why these can't be a prompt's token ids (checked before anything reaches the model,
    where a bad id would fail the whole step, not just its request), or None."""
    if not token_ids:
        return "prompt must have at least one token"
    for t in token_ids:
        if type(t) is not int or not 0 <= t < vocab_size:  # bool and numpy ints included
            return f"prompt token ids must be ints in [0, {vocab_size}); got {t!r}"
    return None


def never_fits_reason(
    req: Request,
    num_blocks: int,
    block_size: int,
    max_model_len: int | None,
    config: SchedulerConfig,
) -> str | None:
    """Why the request's prompt can never be scheduled, or None if it can."""
    n = req.num_prompt_tokens
    max_num_batched_tokens = config.max_num_batched_tokens
    if max_model_len is not None and n > max_model_len:
        return f"prompt has {n} tokens, longer than max_model_len={max_model_len}"
    if cdiv(n, block_size) > num_blocks:
        return f"prompt does not fit: {outgrown_reason(n, num_blocks, block_size)}"
    if not config.enable_chunked_prefill and n > max_num_batched_tokens:
        return (
            f"prompt has {n} tokens, more than max_num_batched_tokens={max_num_batched_tokens} "
            "with chunked prefill disabled"
        )
    return None


def outgrown_reason(num_tokens: int, num_blocks: int, block_size: int) -> str | None:
    """Why ``num_tokens`` tokens of KV can never fit the whole cache, or None if they can."""
    need = cdiv(num_tokens, block_size)
    if need <= num_blocks:
        return None
    return (
        f"KV cache capacity exceeded: {num_tokens} tokens need {need} blocks, more than "
        f"the whole cache ({num_blocks} blocks of {block_size} tokens)"
    )


def stop_status(req: Request, token: int, max_model_len: int | None) -> RequestStatus | None:
    """The finished status after ``token`` was appended, or None to keep going.

    A stop token wins over a length limit reached by the same token.
    """
    params = req.sampling_params
    stoppable = len(req.output_token_ids) >= params.min_tokens  # the sampler bans them before
    if stoppable and (token in params.stop_token_ids
                      or (token == req.eos_token_id and not params.ignore_eos)):
        return RequestStatus.FINISHED_STOPPED
    if len(req.output_token_ids) >= params.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    if max_model_len is not None and req.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None
