"""Structured outputs: a request's grammar compiled once (``compiler``), each constrained
sequence's parser (``rows``), and the backend behind both (``backend``, llguidance). Torch-free;
the runner turns the parsers into a logits mask (``engine.runner.grammar_mask``)."""
