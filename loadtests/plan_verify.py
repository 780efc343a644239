"""`carpool plan --verify`: serve one instance with the plan's flags, load-test it at about
its planned share of the peak (``carpool loadtest``'s Locust run, closed loop: the user count
is sized by Little's law from the predicted latency), then replay the *observed* arrivals
and lengths through the simulator and print predicted against measured, per tier.

The replay makes the comparison about the model, not about the load generator: the same
arrival times, prompt and output token counts (the model may stop at EOS before max_tokens)
and tiers. Measured TTFT includes what the simulator does not model: HTTP, Redis, the
tokenizer and the drainer's queueing.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from engine.core.config import CacheConfig, SchedulerConfig
from engine.sim.cost import CostModel
from engine.sim.metrics import TierSummary
from engine.sim.planner import Plan
from engine.sim.report import table
from engine.sim.simulator import EngineShape, Simulator
from engine.sim.workload import RequestSpec
from gateway.config import GatewayConfig
from loadtests.local_server import local_server
from loadtests.report import load_records
from loadtests.runner import LoadTestOptions, run_loadtest

THINK_S = 0.25  # the Locust users' mean wait between requests (between(0, 0.5))
WORDS_PER_TOKEN = 0.75


def _seconds(run_time: str) -> float:
    m = re.fullmatch(r"(\d+)([smh]?)", run_time.strip())
    if m is None:
        raise ValueError(f"--verify-run-time {run_time!r}: expected 30s, 2m or 1h")
    return int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def verify(plan: Plan, cost: CostModel, run_time: str, out_dir: str) -> str:
    final = plan.final
    assert final is not None and plan.kv is not None
    mean_latency = sum(s.latency_mean * s.n for s in final.tiers) / sum(s.n for s in final.tiers)
    users = max(3, round(final.rps * (mean_latency + THINK_S)))
    out = Path(out_dir)
    rows = _load_test(plan, users, run_time, out)
    records = [r for r in load_records(out / "requests.jsonl") if r.get("ok")]
    if not records:
        return f"verify: the load test completed no request (see {out})"
    measured_rps = len(records) / _seconds(run_time)
    predicted = _replay(plan, cost, records)
    return "\n".join([
        (f"Verification: one instance served with `{plan.serve_flags()}`,\n{users} Locust users "
        f"for {run_time}: {measured_rps:.3f} req/s completed (planned share {final.rps:.3f})"),
        ("predicted = the simulator replaying the observed arrivals, lengths and tiers;\n"
        "measured = the load test (HTTP streaming)"),
        _compare(predicted, rows), f"report: {out}/report.md"])


def _load_test(plan: Plan, users: int, run_time: str, out: Path) -> list[Any]:
    final = plan.final
    assert final is not None and plan.kv is not None
    i = plan.inputs
    words = max(1, round(i.prompt.mean * WORDS_PER_TOKEN))
    opts = LoadTestOptions(out_dir=out, users=users, run_time=run_time, mix="chat=1",
                           chat=f"{words}:{max(1, round(i.output.mean))}")
    engine: dict[str, Any] = {"max_num_seqs": final.batch,
                              "max_num_batched_tokens": final.token_budget,
                              "block_size": plan.kv.block_size,
                              "kv_cache_memory_gb": i.kv_memory_gb}
    if i.shape.dtype_bytes == 2:  # a plan of 2-byte KV: the fp32 model with an fp16 cache
        engine["kv_cache_dtype"] = "float16"
    config = GatewayConfig.from_env(engine="real", engine_options=engine, namespace="planverify")
    return run_loadtest(opts, serve=lambda: local_server(config, {}))


def _replay(plan: Plan, cost: CostModel, records: list[dict[str, Any]]) -> dict[str, TierSummary]:
    final = plan.final
    assert final is not None and plan.kv is not None
    t0 = min(r["start"] for r in records)
    specs = [RequestSpec(f"v{n}", max(1, int(r["completion_tokens"])),
                         max(1, int(r.get("prompt_tokens") or 1)), r["start"] - t0, r["tier"])
             for n, r in enumerate(records)]
    sim = Simulator(cost, SchedulerConfig(max_num_seqs=final.batch,
                                          max_num_batched_tokens=final.token_budget),
                    CacheConfig(block_size=plan.kv.block_size), EngineShape(plan.kv.num_blocks))
    result = sim.run(specs)
    return {t: result.summary(t) for t in result.tiers()}


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1e3:.0f}"


def _compare(predicted: dict[str, TierSummary], measured_rows: list[Any]) -> str:
    rows = []
    for m in measured_rows:
        p = predicted.get(m.tier)
        if p is None:
            continue
        got = {"ttft": m.ttft_ms, "tpot": m.tpot_ms}
        rows.append([m.tier, str(m.ok),
                     f"{_ms(p.ttft_p50)} / {_fmt(got['ttft'].get('p50'))}",
                     f"{_ms(p.ttft_p99)} / {_fmt(got['ttft'].get('p99'))}",
                     f"{_ms(p.tpot_p50)} / {_fmt(got['tpot'].get('p50'))}",
                     f"{_ms(p.tpot_p99)} / {_fmt(got['tpot'].get('p99'))}"])
    return table(["tier", "n", "TTFT p50 ms pred/meas", "TTFT p99", "TPOT p50 ms", "TPOT p99"],
                 rows)


def _fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.0f}"
