"""``carpool serve`` freezes the objects alive after start-up, so full GC passes stop walking
the imports, tokenizer and model; apps made without ``freeze_gc`` (tests) leave the GC alone."""

from __future__ import annotations

import gc
from pathlib import Path

import httpx
import pytest

from tests.gateway.harness import make_config, run_gateway

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("freeze", [False, True])
def test_freeze_after_startup(redis_url: str, tiny_model_dir: Path, freeze: bool) -> None:
    gc.unfreeze()
    config = make_config(engine="echo", model=str(tiny_model_dir))
    try:
        with run_gateway(config, redis_url, freeze_gc=freeze) as gw:
            assert httpx.get(gw.url + "/healthz").status_code == 200
            frozen = gc.get_freeze_count()
            assert (frozen > 10_000) if freeze else frozen == 0
        # unfrozen on shutdown: frozen objects are never finalized, and triton's bindings
        # report each one as leaked at exit
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()  # the rest of the session collects as usual
