"""A discrete-event simulator of the engine: the real ``Scheduler`` and ``BlockManager`` on a
virtual clock, with a runner stand-in that advances time by a step-cost model and emits
tokens by the workload's output lengths. Torch-free (no model, no tensors).

    workload.py   request specs: fixed lists, N at once with a length mix, Poisson, traces
    cost.py       step-cost models: fixed (seed 000's "50 ms a step") and calibrated
    profile.py    the calibrated profile: measured steps, the fit, its JSON file
    simulator.py  the loop: arrivals -> schedule() -> cost -> tokens -> update_from_output()
    metrics.py    per-request TTFT/TPOT/latency, throughput, p50/p99 by tier, time series
    seed000.py    seed 000's worked tables, reproduced by simulation
    kv.py         seed 004 section 6: KV bytes per token, blocks, the concurrency they allow
    planner.py    seed 004 section 12: capacity planning, step by step
    plots.py      optional PNGs (only where matplotlib is installed)
"""
