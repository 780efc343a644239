"""Benchmarks of the kernels (``carpool bench kernels``); never imported by serving."""
