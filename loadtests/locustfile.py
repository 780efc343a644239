"""Carpool load test: one Locust user class per SLA tier, streaming chat completions.

Each tier's users send with that tier's own tenant key and ``service_tier``. Besides the HTTP
request itself (time to response headers), every response is reported to Locust as three more
request types, so Locust's tables and charts show their percentiles per tier:

    TTFT  time to the first content token          (ms)
    TPOT  mean time per output token after the first (ms; needs >= 2 tokens)
    E2E   request start to the end of the stream   (ms; response_length = completion tokens)

Run it through ``carpool loadtest`` (starts a server, writes a per-tier report), or by hand
against any deployment::

    LOCUST_CARPOOL_KEYS="interactive=cp_...,batch=cp_...,best-effort=cp_..." \\
      locust -f loadtests/locustfile.py --headless --host https://carpool.example \\
      --users 12 --spawn-rate 4 --run-time 2m

Options (``locust --help`` lists them; each also reads ``LOCUST_<NAME>`` from the environment,
which is how keys should be passed, so they do not show in ``ps``):
``--carpool-keys tier=key,...``, ``--carpool-model``, ``--carpool-mix chat=0.8,summary=0.2``,
``--carpool-chat WORDS:MAX_TOKENS``, ``--carpool-summary WORDS:MAX_TOKENS``,
``--carpool-log FILE`` (one JSON line per request, for the report).

Only Locust and the standard library: the file can be copied anywhere.
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from locust import HttpUser, between, events, task
from locust.env import Environment

TIERS = ("interactive", "batch", "best-effort")
_WORDS = (
    "river", "mountain", "engine", "quiet", "window", "harvest", "signal", "copper", "garden",
    "lantern", "orbit", "paper", "silver", "thunder", "meadow", "bridge", "compass", "forest",
    "ember", "harbor", "violet", "canyon", "pixel", "rhythm", "anchor", "breeze", "cactus",
    "dune", "falcon", "glacier", "ivory", "jungle", "kettle", "lemon", "marble", "nectar",
)


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    group = parser.add_argument_group("carpool")
    group.add_argument("--carpool-keys", default="", env_var="LOCUST_CARPOOL_KEYS",
                       help="tier=api_key,... one tenant key per tier")
    group.add_argument("--carpool-model", default="", env_var="LOCUST_CARPOOL_MODEL",
                       help="model name to send (default: the first of GET /v1/models)")
    group.add_argument("--carpool-mix", default="chat=0.8,summary=0.2",
                       env_var="LOCUST_CARPOOL_MIX", help="share of each request profile")
    group.add_argument("--carpool-chat", default="24:32", env_var="LOCUST_CARPOOL_CHAT",
                       help="short chat: prompt words:max_tokens")
    group.add_argument("--carpool-summary", default="400:128",
                       env_var="LOCUST_CARPOOL_SUMMARY",
                       help="long summary: prompt words:max_tokens")
    group.add_argument("--carpool-log", default="", env_var="LOCUST_CARPOOL_LOG",
                       help="append one JSON line per request to this file")


class _Log:
    """The per-request JSON-lines log (greenlets share one file; a lock keeps lines whole)."""

    def __init__(self) -> None:
        self._file: Any = None
        self._lock = threading.Lock()

    def open(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            with self._lock:
                self._file.write(json.dumps(record) + "\n")
                self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


LOG = _Log()


@events.test_start.add_listener
def _on_start(environment: Environment, **_: Any) -> None:
    LOG.open(environment.parsed_options.carpool_log if environment.parsed_options else "")


@events.test_stop.add_listener
def _on_stop(environment: Environment, **_: Any) -> None:
    LOG.close()


def parse_pairs(raw: str) -> dict[str, str]:
    """``"a=1,b=2"`` -> ``{"a": "1", "b": "2"}``."""
    out = {}
    for part in raw.split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            out[name.strip()] = value.strip()
    return out


def parse_profile(raw: str) -> tuple[int, int]:
    words, _, max_tokens = raw.partition(":")
    return int(words), int(max_tokens)


def make_prompt(kind: str, words: int, rng: random.Random) -> str:
    text = " ".join(rng.choice(_WORDS) for _ in range(words))
    if kind == "summary":
        return f"Summarize the following notes in a few sentences:\n{text}"
    return f"{text}?"


class _TierUser(HttpUser):
    abstract = True
    tier = ""
    wait_time = between(0.0, 0.5)

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.key = parse_pairs(opts.carpool_keys).get(self.tier, "")
        mix = {k: float(v) for k, v in parse_pairs(opts.carpool_mix).items()}
        self.profiles = {"chat": parse_profile(opts.carpool_chat),
                         "summary": parse_profile(opts.carpool_summary)}
        self.kinds = [k for k in mix if k in self.profiles and mix[k] > 0] or ["chat"]
        self.weights = [mix.get(k, 1.0) for k in self.kinds]
        self.model = opts.carpool_model or self._first_model()
        self.rng = random.Random()

    def _first_model(self) -> str:
        with self.client.get("/v1/models", headers=self._headers(), name="/v1/models",
                             catch_response=True) as resp:
            try:
                return str(resp.json()["data"][0]["id"])
            except (ValueError, KeyError, IndexError):
                resp.failure(f"no model list: HTTP {resp.status_code}")
                return "default"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def chat(self) -> None:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        words, max_tokens = self.profiles[kind]
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": make_prompt(kind, words, self.rng)}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "service_tier": self.tier,
        }
        record: dict[str, Any] = {"tier": self.tier, "kind": kind, "start": time.time()}
        start = time.perf_counter()
        with self.client.post("/v1/chat/completions", json=body, headers=self._headers(),
                              stream=True, catch_response=True,
                              name=f"chat [{self.tier}]") as resp:
            record["status"] = resp.status_code
            if resp.status_code != 200:
                record["error"] = resp.text[:200]
                resp.failure(f"HTTP {resp.status_code}")
            else:
                error = self._read_stream(resp, start, record)
                if error:
                    record["error"] = error
                    resp.failure(error)
        record["ok"] = record["status"] == 200 and "error" not in record
        LOG.write(record)
        if record["ok"]:
            self._fire(record)

    def _read_stream(self, resp: Any, start: float, record: dict[str, Any]) -> str | None:
        """Read the SSE stream, filling ``record``; returns an error text or None."""
        first = last = None
        chunks = 0
        usage = None
        finish = None
        try:
            for line in resp.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    return f"stream error: {event['error']}"
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                    if (choice.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        first = now if first is None else first
                        last = now
                        chunks += 1
        except (OSError, ValueError) as exc:  # a broken stream fails the request, no crash
            return f"stream broken: {exc!r}"
        end = time.perf_counter()
        tokens = int(usage["completion_tokens"]) if usage else chunks
        record.update(
            e2e_ms=(end - start) * 1000,
            ttft_ms=None if first is None else (first - start) * 1000,
            tpot_ms=(last - first) * 1000 / (tokens - 1)
            if first is not None and last is not None and tokens > 1 else None,
            completion_tokens=tokens,
            prompt_tokens=int(usage["prompt_tokens"]) if usage else None,
            finish_reason=finish,
        )
        return None if usage is not None else "stream ended without usage"

    @task
    def stream_chat(self) -> None:
        self.chat()

    def _fire(self, record: dict[str, Any]) -> None:
        fire = self.environment.events.request.fire
        for kind in ("ttft", "tpot", "e2e"):
            value = record.get(f"{kind}_ms")
            if value is not None:
                fire(request_type=kind.upper(), name=self.tier, response_time=value,
                     response_length=record["completion_tokens"] if kind == "e2e" else 0,
                     exception=None, context={})


class InteractiveUser(_TierUser):
    tier = "interactive"


class BatchUser(_TierUser):
    tier = "batch"


class BestEffortUser(_TierUser):
    tier = "best-effort"
