"""The text of `carpool plan`: seed 004 section 12's six steps, then the recommendation."""

from __future__ import annotations

from engine.sim.fleet import FleetResult
from engine.sim.planner import PREFILL_STEP_FACTOR, Plan
from engine.sim.report import seconds, table, tier_table


def render(plan: Plan, cost_about: str) -> str:
    return "\n\n".join([_inputs(plan, cost_about), _batch(plan), _kv(plan), _capacity(plan),
                        _instances(plan), _checks(plan), _recommendation(plan)])


def _inputs(plan: Plan, cost_about: str) -> str:
    i = plan.inputs
    rows = [[t.tier, f"{t.ttft_p99_s:g} s", f"{t.tpot_p99_s:g} s", f"{i.shares[t.tier]:.0%}"]
            for t in i.targets]
    return "\n".join([
        "Step 1. Inputs (targets first)",
        table(["tier", "TTFT p99 <=", "TPOT p99 <=", "share"], rows),
        (f"peak {i.peak_rps:g} req/s; prompt {i.prompt.low}..{i.prompt.high} tokens (mean "
        f"{i.prompt.mean:g}); output {i.output.low}..{i.output.high} (mean {i.output.mean:g}); "
        f"KV memory {i.kv_memory_gb:g} GB per instance"
        + (f"; {i.constrained:.0%} of requests constrained (each pays the grammar mask)"
           if i.constrained else "")),
        f"step cost: {cost_about}"])


def _batch(plan: Plan) -> str:
    i = plan.inputs
    lines = ["Step 2. Largest batch from the TPOT target",
             (f"tightest TPOT target {plan.tpot_target:g} s; a decode row reads {i.decode_context:g} "
             f"tokens of context (prompt mean + output mean / 2)")]
    if plan.tpot_bounded:
        lines.append(f"a decode step of {plan.tpot_batch} rows takes {plan.tpot_batch_step_s:.4f} s "
                     f"<= {plan.tpot_target:g} s; {plan.tpot_batch + 1} rows would not: batch <= "
                     f"{plan.tpot_batch}")
    else:
        lines.append(f"the cost model stays within the target up to the {i.max_batch}-row limit: "
                     f"TPOT does not bound the batch (batch <= {plan.tpot_batch})")
    first = plan.checks[0] if plan.checks else None
    if first is not None:
        lines.append(f"token budget per step: {first.token_budget} (the rows plus the largest "
                     f"prefill chunk whose step\nstays within {PREFILL_STEP_FACTOR:g} x the TPOT "
                     f"target)")
    return "\n".join(lines)


def _kv(plan: Plan) -> str:
    kv, s = plan.kv, plan.inputs.shape
    assert kv is not None
    return "\n".join([
        "Step 3. Concurrency from KV memory (seed 004 section 6)",
        (f"2 x {s.layers} layers x {s.kv_heads} KV heads x {s.head_dim} head dim x "
        f"{s.dtype_bytes} bytes = {kv.bytes_per_token:,} bytes per token"),
        (f"{plan.inputs.kv_memory_gb:g} GB / ({kv.bytes_per_token:,} x {kv.block_size}-token blocks) "
        f"= {kv.num_blocks:,} blocks"),
        (f"average sequence {kv.avg_seq_len:g} tokens (prompt + output) = {kv.blocks_per_request} "
        f"blocks: {kv.num_blocks:,} // {kv.blocks_per_request} = {kv.concurrency} requests at once")])


def _capacity(plan: Plan) -> str:
    kv = plan.kv
    assert kv is not None
    return (f"Step 4. One instance's batch = min({plan.tpot_batch}, {kv.concurrency}) = "
            f"{plan.batch} (bound by {plan.bound})")


def _instances(plan: Plan) -> str:
    i = plan.inputs
    return "\n".join([
        "Step 5. Instances for the peak",
        (f"demand {i.peak_rps:g} req/s x {i.output.mean:g} output tokens = "
        f"{plan.demand_tok_s:,.1f} tok/s"),
        f"one instance decodes {plan.batch} rows a step: {plan.instance_tok_s:,.1f} tok/s",
        (f"ceil({plan.demand_tok_s:,.1f} / {plan.instance_tok_s:,.1f}) = "
        f"{plan.instances_estimate} instance(s)")])


def _checks(plan: Plan) -> str:
    rows = [[str(n), str(c.instances), str(c.batch), str(c.token_budget), f"{c.rps:.3f}",
             "ok" if c.ok else "; ".join(c.misses)] for n, c in enumerate(plan.checks, 1)]
    return "\n".join([
        "Step 6. Verification by simulation: one instance at its share of the peak",
        ("(Poisson arrivals, tiers by share; a TPOT miss shrinks the batch, a TTFT miss adds "
        "instances)"),
        table(["#", "instances", "batch", "token budget", "req/s each", "result"], rows)])


def _recommendation(plan: Plan) -> str:
    final = plan.final
    if not plan.feasible or final is None:
        return f"No plan meets the targets: {plan.reason}."
    lines = [(f"Recommendation: {final.instances} instance(s), each taking 1/{final.instances} "
             f"of the peak ({final.rps:.3f} req/s)"),
             f"  {plan.serve_flags()}",
             "", f"Predicted per tier (simulated, one instance at {final.rps:.3f} req/s):",
             tier_table(final.tiers)]
    if plan.headroom is not None:
        top = " (at least; the search stops there)" if plan.headroom >= 3 else ""
        lines.append(f"\nHeadroom: one instance keeps every target up to {plan.headroom:+.0%} "
                     f"over its share ({final.rps * (1 + plan.headroom):.3f} req/s){top}")
    margins = [f"{t.tier} TTFT p99 {s.ttft_p99:.3f}/{t.ttft_p99_s:g} s, TPOT p99 "
               f"{s.tpot_p99:.4f}/{t.tpot_p99_s:g} s"
               for t, s in zip(plan.inputs.targets, final.tiers)]
    lines.append("Predicted p99 / target:\n  " + "\n  ".join(margins))
    return "\n".join(lines)


def placement_section(results: dict[str, FleetResult], prefixes: int, prefix_tokens: int,
                      skewed: bool) -> str:
    """What prefix-aware placement buys the plan's fleet (``engine.sim.fleet.plan_placement``):
    one row per arm, the cached prompt tokens also against one instance alone's."""
    alone = results["one instance"].cached_tokens
    rows = [[name, str(len(r.per_instance)), f"{r.cached_tokens:,} / {r.prompt_tokens:,}",
             f"{r.cached_tokens / alone:.2f}x" if alone else "-", seconds(r.ttft(50)),
             seconds(r.ttft(99)), f"{r.spread:.2f}", str(r.stolen)]
            for name, r in results.items()]
    placed, plain = results["placement"], results["no placement"]
    ratio = placed.ttft(50) / plain.ttft(50) if plain.ttft(50) > 0 else float("nan")
    advice = (f"placement: TTFT p50 x{ratio:.2f} of the plain pull's; serve with "
              "--placement-wait-ms 75 on gateways and workers")
    if len(placed.per_instance) == 1:
        advice = "one instance: placement has nothing to choose"
    return "\n".join([
        (f"Prefix-aware placement: multi-turn chats (3 turns) over {prefixes} shared system "
         f"prompts of {prefix_tokens} tokens" + (", half the chats on one" if skewed else "")
         + ", at the peak rate"),
        table(["arm", "instances", "cached prompt tokens", "vs one instance", "TTFT p50",
               "TTFT p99", "busiest / mean", "stolen"], rows),
        advice])
