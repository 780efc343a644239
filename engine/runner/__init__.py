"""The tensor side of the engine: model runner, sampler, checkpoint loader."""
