"""``carpool bench placement``: prefix-aware placement against the plain pull, in one run.

Three workers (``carpool serve --role worker``, placement wait ``--wait-ms``) and two
gateways on one Redis: one gateway tags entries with the worker their prompt's leading KV
blocks hash to (``--placement-wait-ms``), the other does not (``0``), so the same fleet serves
both arms. Then one worker alone (its own Redis namespace and gateway) serves the same
workload: what a single prefix cache reuses, the goal's baseline.

The workload is multi-turn chats over ``--prompts`` shared system prompts of about
``--prompt-words`` words (~500 tokens): each chat picks a system prompt and sends
``--turns`` turns, each turn's prompt the previous one + its answer + a new question, so a
turn can reuse its system prompt and its own history. ``uniform``: chats spread evenly over
the prompts; ``skewed``: half the chats use prompt 0. Every arm gets its own set of system
prompts (no arm reuses another's cache). ``--clients`` threads send chats concurrently, a turn
after the previous one's answer.

Per arm: prefix-cache hit tokens (``usage.prompt_tokens_details.cached_tokens``, summed),
against the one-worker run's; TTFT p50/p99 at the client; and the requests each worker ran
(the request's ``worker`` in Redis), as max / mean.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.bench.rolling import Fleet, make_key, percentile
from gateway.bench.sla import cpu_model
from gateway.bus.client import text as text_of

NAMESPACE = "benchroll"  # rolling's key and fleet helpers use this namespace
WORDS = ["cache", "token", "prompt", "worker", "queue", "tenant", "river", "mountain", "garden", "copper", "silver", "violet", "engine", "signal", "harbor", "lantern", "meadow", "orbit", "pixel", "quartz", "ribbon", "saddle", "timber", "velvet", "walnut", "yellow", "zephyr", "anchor", "basket", "candle", "dragon", "ember", "falcon", "glacier", "hollow", "island", "jigsaw", "kettle", "ladder", "marble", "needle", "oyster", "pepper", "quiver", "rocket", "spiral", "thunder"]


@dataclass
class Turn:
    arm: str
    ok: bool
    ttft_s: float | None = None
    cached: int = 0
    prompt_tokens: int = 0
    worker: str = ""
    error: str = ""


@dataclass
class Arm:
    name: str
    turns: list[Turn] = field(default_factory=list)

    def row(self, alone_cached: int) -> str:
        ok = [t for t in self.turns if t.ok]
        ttft = [t.ttft_s for t in ok if t.ttft_s is not None]
        cached = sum(t.cached for t in ok)
        per: dict[str, int] = {}
        for t in ok:
            per[t.worker] = per.get(t.worker, 0) + 1
        spread = max(per.values()) / statistics.mean(per.values()) if per else 0.0
        ratio = cached / alone_cached if alone_cached else 0.0
        return (f"| {self.name} | {len(ok)}/{len(self.turns)} | {cached} | "
                f"{sum(t.prompt_tokens for t in ok)} | {ratio:.2f} | {_ms(percentile(ttft, 0.5))} "
                f"| {_ms(percentile(ttft, 0.99))} | {sorted(per.values(), reverse=True)} | "
                f"{spread:.2f} |")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def system_prompts(n: int, words: int, seed: int) -> list[str]:
    """``n`` distinct system prompts, distinct from their first words (a per-prompt id)."""
    rng = random.Random(seed)
    return [f"System {seed}-{i}: you are assistant number {i}. "
            + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(n)]


def chats(n_chats: int, n_prompts: int, skewed: bool) -> list[int]:
    """The system prompt of each chat: evenly spread, or half of them on prompt 0."""
    if not skewed:
        return [c % n_prompts for c in range(n_chats)]
    return [0 if c % 2 == 0 else 1 + (c // 2) % (n_prompts - 1) for c in range(n_chats)]


class Client:
    """Sends one chat's turns after another through ``url``; records each turn."""

    def __init__(self, url: str, key: str, model: str, redis_url: str, args: argparse.Namespace
                 ) -> None:
        import redis as sync_redis

        self.url, self.key, self.model, self.args = url, key, model, args
        self.redis = sync_redis.Redis.from_url(redis_url)

    def chat(self, arm: Arm, system: str, chat_id: int, namespace: str) -> None:
        prompt = system
        for turn in range(self.args.turns):
            prompt += f"\nUser: question {chat_id}.{turn} about {WORDS[(chat_id + turn) % 40]}?" \
                      f"\nAssistant:"
            got, text = self._send(arm.name, prompt, namespace)
            arm.turns.append(got)
            if not got.ok:
                return
            prompt += text

    def _send(self, arm: str, prompt: str, namespace: str) -> tuple[Turn, str]:
        import json

        import httpx

        body = {"model": self.model, "prompt": prompt, "max_tokens": self.args.max_tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        t0, first, rid, text = time.monotonic(), None, "", []
        usage: dict[str, Any] = {}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=300,
                              headers={"Authorization": f"Bearer {self.key}"}) as resp:
                if resp.status_code != 200:
                    return Turn(arm, False, error=f"status {resp.status_code}"), ""
                for line in resp.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[len("data: "):])
                    rid = event.get("id", rid)
                    usage = event.get("usage") or usage
                    if event.get("choices") and event["choices"][0].get("text"):
                        first = first or time.monotonic()
                        text.append(event["choices"][0]["text"])
        except httpx.HTTPError as exc:
            return Turn(arm, False, error=repr(exc)), ""
        worker = text_of(self.redis.hget(f"{namespace}:req:{rid}", "worker") or "?")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return Turn(arm, True, None if first is None else first - t0, int(cached),
                    int(usage.get("prompt_tokens", 0)), worker), "".join(text)


def run_arm(arm: Arm, url: str, key: str, model: str, redis_url: str, prompts: list[str],
            assignment: list[int], args: argparse.Namespace, namespace: str) -> None:
    """Every chat of ``assignment`` through ``url``, ``args.clients`` at a time."""
    todo = list(enumerate(assignment))
    lock = threading.Lock()

    def client() -> None:
        c = Client(url, key, model, redis_url, args)
        while True:
            with lock:
                if not todo:
                    return
                chat_id, p = todo.pop(0)
            c.chat(arm, prompts[p], chat_id, namespace)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@dataclass
class Served:
    fleet: Fleet
    placed: str  # the gateway with placement
    plain: str  # the one without
    model: str
    key: str


def _fleet(redis_url: str, model: str, args: argparse.Namespace, folder: Path,
           workers: int) -> Served:
    """``workers`` workers with the placement wait, a gateway with placement, one without."""
    import httpx

    common = ["--max-num-seqs", "8", *args.serve_arg]
    fleet = Fleet(redis_url, model, [*common, "--placement-wait-ms", str(args.wait_ms)],
                  folder, 5.0, 2.0)
    for _ in range(workers):
        fleet.start("worker")
    placed = fleet.start("gateway")
    fleet.serve_args = [*common, "--placement-wait-ms", "0"]
    plain = fleet.start("gateway")
    key = asyncio.run(make_key(redis_url))
    name = httpx.get(placed.url + "/v1/models", timeout=10, headers={
        "Authorization": f"Bearer {key}"}).json()["data"][0]["id"]
    return Served(fleet, placed.url, plain.url, name, key)


def run(args: argparse.Namespace, model: str) -> tuple[dict[str, dict[str, Arm]], list[str]]:
    """Every arm of both workloads ({workload: {arm: Arm}}), and the workers that exited
    before their fleet was stopped (a crash or the OOM killer: the table is then no
    comparison of 3 workers)."""
    from gateway.bus.embedded import EmbeddedRedis

    out: dict[str, dict[str, Arm]] = {}
    lost: list[str] = []
    workloads = {"uniform": chats(args.chats, args.prompts, False),
                 "skewed": chats(args.chats, args.prompts, True)}
    for n_workers, arms in ((3, ("placement", "no placement")), (1, ("one worker",))):
        with EmbeddedRedis() as redis, tempfile.TemporaryDirectory() as tmp:
            fleet = _fleet(redis.url, model, args, Path(tmp), n_workers)
            try:
                for w, (workload, assignment) in enumerate(workloads.items()):
                    for arm in arms:
                        # each arm of a fleet its own system prompts (no cache shared between
                        # arms); one worker alone gets the placement arm's, in its own fleet
                        seed = 2 * w + (arm == "no placement")
                        prompts = system_prompts(args.prompts, args.prompt_words, seed)
                        got = out.setdefault(workload, {}).setdefault(arm, Arm(arm))
                        run_arm(got, fleet.plain if arm == "no placement" else fleet.placed,
                                fleet.key, fleet.model, redis.url, prompts, assignment, args,
                                NAMESPACE)
                lost += [f"{m.log.name}: exit {m.popen.returncode}"
                         for m in fleet.fleet.workers if m.popen.poll() is not None]
            finally:
                fleet.fleet.stop_all()
    return out, lost


def table(results: dict[str, dict[str, Arm]]) -> list[str]:
    lines = []
    for workload, arms in results.items():
        alone = sum(t.cached for t in arms["one worker"].turns if t.ok)
        lines += [f"{workload}:", ("| arm | turns ok | cached tokens | prompt tokens | "
                                   "cached / one worker | TTFT p50 ms | TTFT p99 ms | "
                                   "requests per worker | max / mean |"),
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += [arms[a].row(alone) for a in ("placement", "no placement", "one worker")]
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="carpool bench placement", description=__doc__)
    p.add_argument("--model", default=None, help="checkpoint dir (default: bundled SmolLM2)")
    p.add_argument("--prompts", type=int, default=16, help="shared system prompts")
    p.add_argument("--prompt-words", type=int, default=380, help="~500 tokens")
    p.add_argument("--chats", type=int, default=32)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--clients", type=int, default=4, help="chats sent at once")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--wait-ms", type=float, default=75.0,
                   help="the workers' placement wait (--placement-wait-ms)")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="extra `carpool serve` argument (repeat)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from engine.model_files import resolve_model_dir

    args = parse_args(argv)
    results, lost = run(args, str(resolve_model_dir(args.model)))
    print(f"placement: 3 workers (wait {args.wait_ms:g} ms) against the plain pull and one "
          f"worker alone; {args.chats} chats x {args.turns} turns over {args.prompts} system "
          f"prompts, {args.clients} clients, {args.max_tokens} tokens an answer; {cpu_model()}")
    print("\n".join(table(results)))
    for line in lost:
        print(f"INVALID: a worker exited during the run ({line}); its arms ran on fewer workers")
    return 0 if not lost and all(t.ok for arms in results.values() for a in arms.values()
                                 for t in a.turns) else 1
