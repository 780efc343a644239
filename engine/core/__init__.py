"""The engine's torch-free core: requests, scheduler, KV block manager, configs, outputs.

Nothing here imports torch (tests/engine/core/test_torch_free.py checks it)."""
