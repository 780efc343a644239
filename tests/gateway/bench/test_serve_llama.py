"""The llama.cpp baseline of ``carpool bench serve`` without llama.cpp (it is an optional
extra): the F32 and Q8_0 conversions' command line, made once into the cache through a temporary name
(a stand-in ``llama-quantize`` script records its calls), nothing left behind when it fails;
no binary is said, not raised."""

from __future__ import annotations

import argparse
import contextlib
import stat
import subprocess
from pathlib import Path

import pytest

from gateway.bench import serve, serve_llama
from gateway.process import child_env

FAKE_QUANTIZE = """#!/bin/sh
# a stand-in llama-quantize: log argv and whether the output existed already, then write it
echo "$@" "exists=$(test -e "$3" && echo 1 || echo 0)" >> "{log}"
[ "{fail}" = 1 ] && exit 3
printf 'GGUF-F32' > "$3"
"""


def _fake(tmp_path: Path, fail: bool = False) -> tuple[str, Path]:
    log = tmp_path / "calls.log"
    script = tmp_path / "llama-quantize"
    script.write_text(FAKE_QUANTIZE.format(log=log, fail=int(fail)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), log


@pytest.mark.parametrize("kind", ["F32", "Q8_0"])
def test_requant_command_line(kind: str) -> None:
    src, dst = Path("/m/SmolLM2-135M-Instruct.Q4_1.gguf"), Path("/c/out.gguf")
    assert serve_llama.requant_command("/bin/llama-quantize", src, dst, kind) == [
        "/bin/llama-quantize", "--allow-requantize", str(src), str(dst), kind]
    assert serve_llama.requant_path(src, Path("/c"), kind) == Path(
        f"/c/gguf/SmolLM2-135M-Instruct.Q4_1.{kind}.gguf")


def test_f32_gguf_is_made_once_through_a_temporary_name(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    quantize, log = _fake(tmp_path)
    src = tmp_path / "model.Q4_1.gguf"
    src.write_bytes(b"q4")
    first = serve_llama.requant_gguf(src, quantize, tmp_path / "cache", "F32")
    again = serve_llama.requant_gguf(src, quantize, tmp_path / "cache", "F32")
    assert first == again == serve_llama.requant_path(src, tmp_path / "cache", "F32")
    assert first.read_bytes() == b"GGUF-F32"
    calls = log.read_text().splitlines()
    assert len(calls) == 1  # the second run found the cached file
    flag, source, out, kind, existed = calls[0].split()
    assert (flag, source, kind, existed) == ("--allow-requantize", str(src), "F32", "exists=0")
    assert Path(out).parent == first.parent and Path(out) != first  # renamed into place
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]
    said = capsys.readouterr().out
    assert "making F32 weights" in said and "(cached)" in said


def test_a_failed_conversion_leaves_nothing(tmp_path: Path) -> None:
    quantize, _ = _fake(tmp_path, fail=True)
    src = tmp_path / "model.gguf"
    src.write_bytes(b"q4")
    with pytest.raises(subprocess.CalledProcessError):
        serve_llama.requant_gguf(src, quantize, tmp_path / "cache", "F32")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_configs_q4_then_f32_and_no_quantize_says_so(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    quantize, _ = _fake(tmp_path)
    server = Path(quantize).with_name("llama-server")
    server.write_text("")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"q4")
    args = argparse.Namespace(llama_slots=[16, 64], llama_f32_slots=[64], llama_q8_slots=[8],
                              cache_dir=str(tmp_path / "c"))
    got = [(c.weights, c.slots, c.gguf) for c in serve_llama.configs(args, str(server), gguf)]
    f32 = serve_llama.requant_path(gguf, tmp_path / "c", "F32")
    q8 = serve_llama.requant_path(gguf, tmp_path / "c", "Q8_0")
    assert got == [("Q4_1", 16, gguf), ("Q4_1", 64, gguf), ("F32", 64, f32), ("Q8_0", 8, q8)]
    assert f32.is_file() and q8.is_file()
    Path(quantize).unlink()
    lone = tmp_path / "lone" / "llama-server"
    lone.parent.mkdir()
    if serve_llama.quantize_binary(str(lone)) is None:  # none on PATH either
        assert len(serve_llama.configs(args, str(lone), gguf)) == 2
        assert "the F32 and Q8_0 rows are skipped" in capsys.readouterr().out


def test_llama_baseline_without_a_binary_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    args = serve.parse_args(["--quick", "--llama-server", "/nonexistent/llama-server"])
    with contextlib.ExitStack() as keep:
        assert serve_llama.llama_rows(serve.make_workload(2, 1, 2), args, keep) == ([], [])
    assert "no llama-server binary found" in capsys.readouterr().out


def test_bundled_gguf_is_the_model_wheels() -> None:
    gguf = serve_llama.bundled_gguf()
    assert gguf is not None and gguf.suffix == ".gguf" and gguf.stat().st_size > 1 << 20


def test_llama_server_runs_without_carpools_openmp_wait_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PASSIVE, set by Carpool's CLI for its own rows, must not reach the baseline (it cost
    llama-server ~40% at one stream): the rest of the environment does."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "20000")
    monkeypatch.setenv("CARPOOL_SOMETHING", "kept")
    env = serve_llama.baseline_env(child_env())
    assert "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env
    assert env["CARPOOL_SOMETHING"] == "kept" and env["PATH"]
