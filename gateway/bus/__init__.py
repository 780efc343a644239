"""What crosses Redis between gateways and workers: key names, typed messages, tier queues,
Lua scripts, connections, and the embedded server."""
