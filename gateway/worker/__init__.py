"""The worker side of Redis: drains tier queues into an engine and writes its outputs back."""
