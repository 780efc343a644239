"""The worker's claim, backlog-read and done scripts, the cancel, the pending index's prune and
departures, and the audit append, beside
``scripts.py`` (which holds the rest): each one atomic step of the protocol named above it,
called through ``resp.LuaScript``."""

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
  local h = redis.call('HMGET', req, 'state', 'cancel', 'sent')
  local st, c = h[1], h[2]
  local res
  if not st then
    res = 'gone'
  elseif c then
    res = (c == 'live' and st == 'running') and 'abort' or 'cancelled'
  elseif st == 'queued' or (st == 'running' and ARGV[2] == '1') then
    redis.call('HSET', req, 'state', 'running', 'worker', ARGV[1])
    res = (st == 'running' and h[3]) and 'lost' or 'run'
  else
    res = st
  end
  out[#out + 1] = res
end
return out
"""


# -- the drainer's backlog view (``bus/queues.py``, ``bus/shard_view.py``) ------------------

# KEYS (one shard): per tier, its backlogged hash and its vtc hash, then the shard's depth hash
# ARGV: how many candidates to list per tier, then the tiers
# Per tier: {entries not yet picked, {tenant, counter, ...}}, the backlogged tenants with the
# least counters (at most that many; counters as Redis stores them). A tier whose count of
# entries not yet picked ('b:' .. tier in the depth hash) is 0 is not read: an idle shard costs
# one HMGET.
BACKLOG_LUA = """
local k = tonumber(ARGV[1])
local dk = KEYS[#KEYS]
local fields = {}
for j = 2, #ARGV do fields[#fields + 1] = 'b:' .. ARGV[j] end
local waiting = redis.call('HMGET', dk, unpack(fields))
local out = {}
for i = 1, #KEYS - 1, 2 do
  local n, rows = 0, {}
  local h = {}
  if tonumber(waiting[(i + 1) / 2] or '0') > 0 then h = redis.call('HGETALL', KEYS[i]) end
  local counters = {}  -- one HMGET per 1000 tenants (unpack's stack is bounded)
  for lo = 1, #h, 2000 do
    local names = {}
    for j = lo, math.min(#h, lo + 1998), 2 do names[#names + 1] = h[j] end
    for _, c in ipairs(redis.call('HMGET', KEYS[i + 1], unpack(names))) do
      counters[#counters + 1] = c
    end
  end
  for j = 1, #h, 2 do
    n = n + tonumber(h[j + 1])
    rows[#rows + 1] = {h[j], counters[(j + 1) / 2] or '0'}
  end
  table.sort(rows, function(x, y)
    if tonumber(x[2]) ~= tonumber(y[2]) then return tonumber(x[2]) < tonumber(y[2]) end
    return x[1] < y[1]
  end)
  local flat = {}
  for j = 1, math.min(k, #rows) do
    flat[#flat + 1] = rows[j][1]
    flat[#flat + 1] = rows[j][2]
  end
  if n == 0 and tonumber(waiting[(i + 1) / 2] or '0') > 0 then
    redis.call('HSET', dk, fields[(i + 1) / 2], 0)  -- a count that outlived its entries
  end
  out[#out + 1] = {n, flat}
end
return out
"""


# -- an entry dropped unrun (``bus/queues.py``) -----------------------------------------------

# KEYS: a tenant's stream, its shard's depth hash, the tier's tenant set of that shard, the
#       shard's pending index (``bus/pending.py``)
# ARGV: group, entry id, tier, tenant
# Acknowledges and deletes an entry dropped unrun (cancelled, finished, a duplicate); a
# delete that found the entry leaves the tier's depth. A stream left empty is deleted and its
# tenant leaves the set and the index.
DONE_LUA = """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if redis.call('XDEL', KEYS[1], ARGV[2]) == 1 then
  if redis.call('HINCRBY', KEYS[2], ARGV[3], -1) < 0 then redis.call('HSET', KEYS[2], ARGV[3], 0) end
end
if redis.call('XLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[3], ARGV[4])
  redis.call('SREM', KEYS[4], ARGV[3] .. ':' .. ARGV[4])
end
return 1
"""


# -- cancellation (``http/cancel.py``, through ``queues.py``) ---------------------------------

# KEYS (the tenant's shard): req, out, stats, queue (the request's tier stream of its tenant),
#       backlogged (that tier's), depth, the tier's tenant set, the pending index
# ARGV: reader_gone (0/1), cancel payload, channel, finish type, finish data, ttl, group, tier
# Returns the state found: queued | running | finished | cancelled | unknown. An entry deleted
# before any worker picked it leaves its tenant's backlog count and the tier's depth.
CANCEL_LUA = """
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'unknown' end
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'cancel', ARGV[1] == '1' and 'gone' or 'live')
  local e, t = redis.call('HGET', KEYS[1], 'entry'), redis.call('HGET', KEYS[1], 'tenant')
  if e and t and redis.call('HGET', KEYS[1], 'tier') == ARGV[8] then
    local q = KEYS[4]
    local picked = redis.call('EXISTS', q) == 0 or #redis.call('XPENDING', q, ARGV[7], e, e, 1) > 0
    if redis.call('XDEL', q, e) == 1 then
      if not picked then
        if redis.call('HINCRBY', KEYS[5], t, -1) <= 0 then redis.call('HDEL', KEYS[5], t) end
        if redis.call('HINCRBY', KEYS[6], 'b:' .. ARGV[8], -1) < 0 then
          redis.call('HSET', KEYS[6], 'b:' .. ARGV[8], 0)
        end
      end
      if redis.call('HINCRBY', KEYS[6], ARGV[8], -1) < 0 then redis.call('HSET', KEYS[6], ARGV[8], 0) end
    end
    if redis.call('XLEN', q) == 0 then  -- an empty stream goes, and its tenant leaves the set
      redis.call('DEL', q)
      redis.call('SREM', KEYS[7], t)
      redis.call('SREM', KEYS[8], ARGV[8] .. ':' .. t)
    end
  end
  if ARGV[1] == '1' then
    redis.call('DEL', KEYS[2])
  else
    redis.call('XADD', KEYS[2], '*', 't', ARGV[4], 'd', ARGV[5])
    redis.call('EXPIRE', KEYS[2], tonumber(ARGV[6]))
  end
  redis.call('HINCRBY', KEYS[3], 'aborted', 1)
  return 'queued'
end
if st == 'running' then
  if not redis.call('HGET', KEYS[1], 'cancel') then
    redis.call('HSET', KEYS[1], 'cancel', ARGV[1] == '1' and 'gone' or 'live')
    redis.call('PUBLISH', ARGV[3], ARGV[2])
  end
  return 'running'
end
return st
"""


# -- the pending index and departures (``bus/pending.py``) ---------------------------------

# KEYS: the shard's pending index, a stream of it;  ARGV: group, the stream's member
# The member leaves the index when the stream is gone or has no pending entry (checked in
# the same step, so a pick that made one pending since the caller's read keeps it).
PRUNE_LUA = """
if redis.call('EXISTS', KEYS[2]) == 1 then
  local s = redis.pcall('XPENDING', KEYS[2], ARGV[1])
  if type(s) == 'table' and not s.err and tonumber(s[1]) > 0 then return 0 end
end
redis.call('SREM', KEYS[1], ARGV[2])
return 1
"""

# KEYS: the worker's streams set of one shard, a stream of it;  ARGV: group, worker, member
# The worker leaves the stream's group if it holds no pending entry there (then the member
# leaves its set; returns 1), else nothing changes (0: its entries are still to take over).
DEPART_LUA = """
if redis.call('EXISTS', KEYS[2]) == 1 then
  local rows = redis.pcall('XPENDING', KEYS[2], ARGV[1], '-', '+', 1, ARGV[2])
  if type(rows) == 'table' and not rows.err then
    if #rows > 0 then return 0 end
    redis.call('XGROUP', 'DELCONSUMER', KEYS[2], ARGV[1], ARGV[2])
  end
end
redis.call('SREM', KEYS[1], ARGV[3])
return 1
"""


# -- the audit trail (``tenancy/audit.py``) ---------------------------------------------------

# KEYS: the audit stream;  ARGV: about how many entries to keep, the entry's JSON.
# An append and its trim in one step (MAXLEN ~: whole nodes are trimmed, so the stream holds
# at least the given number and at most about one node more).
AUDIT_LUA = """
return redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'd', ARGV[2])
"""
