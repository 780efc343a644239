"""The engine bench's decode-attention line times both paths (or says the op is not built)."""

from __future__ import annotations

import re

from engine.bench.cpu_attention import decode_attention_line
from kernels import cpu_decode


def test_line_names_both_paths_with_their_times() -> None:
    line = decode_attention_line(rows=3, max_ctx=40, repeats=1)
    assert re.search(r"torch gather\+SDPA \d+\.\d\d ms", line)
    if cpu_decode.available():
        # the ratio is of the unrounded times: within the printed times' rounding of it
        ref, op, ratio = (float(x) for x in re.findall(r"(\d+\.\d+)(?: ms|x)", line))
        assert (ref - 0.005) / (op + 0.005) <= ratio <= (ref + 0.005) / max(op - 0.005, 1e-9)
    else:
        assert "not built" in line
