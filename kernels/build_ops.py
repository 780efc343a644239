"""``python -m kernels.build_ops [OP ...]``: build the C++ CPU ops once (``make setup``).

One entry point for every op, so that no op module runs as ``__main__`` while the ``kernels``
package has already imported it (runpy warns about that). With no names it builds all of them
in turn; ``make`` runs two of these at a time. A machine with no compiler keeps the torch path
and says so in one line per op (``CppOps.main``).
"""

from __future__ import annotations

import importlib
import sys

# module under kernels/ -> what falls back to torch when it is not built
OPS = {
    "cpu_decode": "decode attention",
    "cpu_layer_ops": "a layer's norms, rotary and SiLU-mul",
    "cpu_small_linear": "small-batch linears",
    "cpu_decode_layers": "a decode step's layers",
}


def main(names: list[str]) -> int:
    unknown = [name for name in names if name not in OPS]
    if unknown:
        print(f"unknown op {', '.join(unknown)}; the ops are {', '.join(OPS)}", file=sys.stderr)
        return 2
    for name in names or list(OPS):
        importlib.import_module(f"kernels.{name}").OPS.main(OPS[name])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
