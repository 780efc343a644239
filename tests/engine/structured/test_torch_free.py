"""engine.structured imports and compiles without torch: the gateway validates grammars with
it, and a gateway-only process never loads torch."""

from __future__ import annotations

from tests.torch_blocker import run_without_torch

SCRIPT = """
    import sys

    from engine.structured import backend, compiler, rows
    from engine.core.structured import StructuredSpec
    from engine.model_files import load_tokenizer, resolve_model_dir

    tok = load_tokenizer(resolve_model_dir(None, None))
    c = compiler.GrammarCompiler(tok, [tok.eos_token_id])
    c.compile(StructuredSpec("json_object"))
    assert "torch" not in sys.modules, "torch was imported"
    print("compiled", len(c))
"""


def test_engine_structured_compiles_without_torch() -> None:
    res = run_without_torch(SCRIPT)
    assert res.returncode == 0, res.stderr
    assert "compiled 1" in res.stdout
