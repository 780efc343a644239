"""``n`` choices through the official ``openai`` client, chat and completions, stream and not,
with logprobs: choice i is what a request of n=1 with seed + i gives (vLLM's rule; the tiny
random Llama in float64, so the shared-prefix path and the separate one agree to the bit),
each streamed chunk carries its choice's index, usage counts every choice's tokens and the
prompt once, the tenant's tpm is charged the same, ``n`` over the cap is a 400, and
cancelling the request frees every sequence's KV blocks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.cancel_helpers import wait_engine_idle
from tests.gateway.conftest import TINY_ENGINE
from tests.gateway.harness import make_config, make_tenant, openai_client, run_gateway

pytestmark = pytest.mark.timeout(180)

N = 3
PROMPT = [17, 400, 9000, 31, 77]


@pytest.fixture(scope="module")
def gw(redis_url: str, tiny_model_dir: Path) -> Iterator[tuple[Any, openai.OpenAI]]:
    config = make_config(engine="real", model=str(tiny_model_dir),
                         engine_options={**TINY_ENGINE, "dtype": "float64"})
    with run_gateway(config, redis_url) as g, openai_client(
            g, redis_url, "par", max_max_tokens=300) as client:
        yield g, client


def _completions(client: openai.OpenAI, model: str, stream: bool, **kw: Any
                 ) -> tuple[list[dict[str, Any]], Any]:
    """Per choice index: text, finish reason, logprobs (token_logprobs); and the usage."""
    args: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 10,
                            "temperature": 1.0, "logprobs": 2, **kw}
    n = kw.get("n", 1)
    choices = [{"text": "", "finish": None, "lps": []} for _ in range(n)]
    if not stream:
        resp = client.completions.create(**args)
        for c in resp.choices:
            assert c.logprobs is not None and c.logprobs.token_logprobs is not None
            choices[c.index] = {"text": c.text, "finish": c.finish_reason,
                                "lps": list(c.logprobs.token_logprobs)}
        return choices, resp.usage
    usage = None
    for chunk in client.completions.create(**args, stream=True,
                                           stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for c in chunk.choices:
            choices[c.index]["text"] += c.text
            choices[c.index]["finish"] = c.finish_reason or choices[c.index]["finish"]
            if c.logprobs and c.logprobs.token_logprobs:
                choices[c.index]["lps"] += c.logprobs.token_logprobs
    return choices, usage


@pytest.mark.parametrize("stream", [False, True])
def test_completion_choices_equal_separate_seeded_requests(gw: tuple[Any, openai.OpenAI],
                                                           stream: bool) -> None:
    g, client = gw
    model = g.engine.model_name
    seed = 40 + stream
    got, usage = _completions(client, model, stream, n=N, seed=seed)
    want = [_completions(client, model, stream, seed=seed + i)[0][0] for i in range(N)]
    for g_choice, w_choice in zip(got, want, strict=True):
        assert g_choice["text"] == w_choice["text"]
        assert g_choice["finish"] == w_choice["finish"]
        assert g_choice["lps"] == pytest.approx(w_choice["lps"], abs=1e-9)
    assert len({c["text"] for c in got}) > 1  # the seeds differ per choice
    assert usage.prompt_tokens == len(PROMPT)  # the prompt counted once
    assert usage.completion_tokens == sum(len(c["lps"]) for c in got)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_choices_are_indexed_with_logprobs(gw: tuple[Any, openai.OpenAI],
                                               stream: bool) -> None:
    g, client = gw
    args: dict[str, Any] = {"model": g.engine.model_name, "n": N, "max_tokens": 8,
                            "messages": [{"role": "user", "content": "Hi"}], "seed": 3,
                            "logprobs": True, "top_logprobs": 2,
                            "extra_body": {"ignore_eos": True}}
    if stream:
        texts, tokens, roles = [""] * N, [0] * N, [0] * N
        finishes: list[str | None] = [None] * N
        for chunk in client.chat.completions.create(**args, stream=True):
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
                roles[c.index] += c.delta.role == "assistant"
                finishes[c.index] = c.finish_reason or finishes[c.index]
                tokens[c.index] += len(c.logprobs.content or []) if c.logprobs else 0
        assert roles == [1] * N
    else:
        resp = client.chat.completions.create(**args)
        assert [c.index for c in resp.choices] == list(range(N))
        texts = [c.message.content or "" for c in resp.choices]
        finishes = [c.finish_reason for c in resp.choices]
        tokens = [len(c.logprobs.content or []) if c.logprobs else 0 for c in resp.choices]
        assert resp.usage is not None and resp.usage.completion_tokens == 8 * N
    assert tokens == [8] * N and finishes == ["length"] * N
    assert len(set(texts)) > 1


def test_n_over_the_cap_and_tpm_charges_every_choice(gw: tuple[Any, openai.OpenAI],
                                                     redis_url: str) -> None:
    g, client = gw
    model = g.engine.model_name
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model, prompt=PROMPT, n=9, max_tokens=2)
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "n"
    k, n = 20, 4
    tpm = len(PROMPT) + n * k  # exactly one n=4 request's reservation
    key = make_tenant(redis_url, g.config.namespace, "par-tpm", tpm=tpm)
    with openai.OpenAI(base_url=g.url + "/v1", api_key=key, max_retries=0) as tight:
        with pytest.raises(openai.BadRequestError):  # n=5 reserves more than the tpm
            tight.completions.create(model=model, prompt=PROMPT, n=5, max_tokens=k)
        resp = tight.completions.create(model=model, prompt=PROMPT, n=n, max_tokens=k,
                                        extra_body={"ignore_eos": True})
        assert resp.usage is not None and resp.usage.completion_tokens == n * k
        # every choice's tokens were charged: no refund left room for even one more choice
        # (had one choice been charged, 3 * 20 tokens would have come back)
        with pytest.raises(openai.RateLimitError):
            tight.completions.create(model=model, prompt=PROMPT, max_tokens=k)


def test_cancel_frees_every_sequence(gw: tuple[Any, openai.OpenAI]) -> None:
    g, client = gw
    steps_before = g.engine.engine.step_count
    # 60 prompt tokens: 3 full blocks of 16 shared by the 4 sequences, each with its own
    # copy of the 4th, so the cancel must drop shared references as well as own blocks
    body = {"model": g.engine.model_name, "prompt": PROMPT * 12, "n": 4, "max_tokens": 250,
            "stream": True, "ignore_eos": True}
    seen: set[int] = set()
    with httpx.stream("POST", g.url + "/v1/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {client.api_key}"}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen.update(c["index"] for c in httpx.Response(
                    200, content=line[6:]).json()["choices"])
            if len(seen) == 4:
                break  # every sequence is running: leave
    wait_engine_idle(g)  # nothing running, every block free
    g.engine.engine.scheduler.block_manager.check_integrity()  # no reference count left over
    assert g.engine.engine.step_count - steps_before < 250, "ran to the end instead"
