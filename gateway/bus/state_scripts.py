"""The worker's claim script, beside ``scripts.py`` (which holds the rest): one atomic step of the
protocol named above it, called through ``resp.LuaScript``."""

from __future__ import annotations

# -- the worker's claim of a request it picked (``bus/queues.py``) ---------------------------

# KEYS: per request: req;  ARGV: consumer, reclaim (0/1)
# Returns one status per request: run | lost (reclaimed with output already sent: its 'sent'
# mark, set by the step writer, outlives a held-back output stream that expired) | abort
# (reclaimed after an explicit cancel its dead worker never answered: the live reader needs a
# final event) | cancelled | finished | gone.  One call for a whole batch: the claim is on the
# path of every request, and a pipeline holding a script costs redis-py an extra SCRIPT EXISTS
# round trip per execute.
CLAIM_LUA = """
local out = {}
for i = 1, #KEYS do
  local req = KEYS[i]
  local st = redis.call('HGET', req, 'state')
  local c = st and redis.call('HGET', req, 'cancel')
  local res
  if not st then
    res = 'gone'
  elseif c then
    res = (c == 'live' and st == 'running') and 'abort' or 'cancelled'
  elseif st == 'queued' or (st == 'running' and ARGV[2] == '1') then
    redis.call('HSET', req, 'state', 'running', 'worker', ARGV[1])
    res = (st == 'running' and redis.call('HGET', req, 'sent')) and 'lost' or 'run'
  else
    res = st
  end
  out[#out + 1] = res
end
return out
"""
