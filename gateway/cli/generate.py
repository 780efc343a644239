"""`carpool generate "prompt"`: stream one completion to the terminal from the offline engine."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("generate", help="generate text for one prompt, streamed to stdout")
    p.add_argument("prompt")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--model", default=None, help="local HF checkpoint dir (default: SmolLM2)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.core.sampling_params import SamplingParams
    from engine.llm_engine import LLMEngine

    engine = LLMEngine.from_kwargs(model=args.model, dtype=args.dtype)
    prompt: str | list[int] = args.prompt
    if args.chat:
        messages = [{"role": "user", "content": args.prompt}]
        prompt = list(
            engine.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    engine.add_request(prompt, params)
    reason = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            sys.stdout.write(out.text_delta)
            sys.stdout.flush()
            if out.finished:
                reason = out.finish_reason
    sys.stdout.write(f"\n[finish_reason={reason}]\n")
    return 0
