"""The Lua scripts Carpool runs in Redis (the worker's claim, the
backlog read and the cancel are in ``state_scripts.py``): each is one atomic step of a protocol
whose owner calls it (named in each section) through ``resp.LuaScript``. Keys and arguments
are documented above each script; key names come from ``keys.py``.

Scripts that touch a tier queue's entries are run only by ``queues.py`` (``QueueEntries``,
the owner of the queue-entry protocol), on behalf of the module named in their section:
``ADMIT_LUA`` enqueues (XADD), ``PICK_LUA`` delivers one (XREADGROUP), ``CANCEL_LUA`` deletes
a queued entry (XDEL), ``STEP_LUA`` acks and deletes a finished one (XACK + XDEL); each does
it in the same atomic step as the request's state change and the fair queue's counters,
which is why the commands live in the scripts and not in ``queues.py``'s own calls.
"""

from __future__ import annotations

# -- admission and settlement (``tenancy/quota.py``; admission through ``queues.py``) ---------
# The bucket math mirrors ``policies/rate_limit.py``.

_BUCKET_LUA = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function level_at(key, limit, now)
  local h = redis.call('HMGET', key, 'level', 'ts')
  if not h[1] then return limit end
  return math.min(limit, tonumber(h[1]) + math.max(0, now - tonumber(h[2])) * limit / 60000)
end
local function store(key, level, now)
  redis.call('HSET', key, 'level', tostring(level), 'ts', tostring(now))
  redis.call('PEXPIRE', key, 120000)
end
"""

ADMIT_LUA = _BUCKET_LUA + """
-- KEYS (all in the tenant's shard): rpm, tpm, conc, queue (the tier's stream of this tenant),
--       req, stats, tier tenants (set), backlogged (hash), vtc (hash), depth (hash), budget
--       (the period's spend, ``policies/budget.py``)
-- ARGV: rpm, tpm, max_conc, queue_max, cost, request_id, lease_ms, type, data, tenant, tier,
--       req_ttl_s, group, prompt tokens, weight, the other shards' depth of the tier (the
--       caller's view), budget (0 = none), the reservation's charge against it, seconds until
--       the period ends [, the preferred worker (prefix-aware placement,
--       ``policies/placement.py``; '' = none)]
-- Returns {'ok', entry id, rpm level, tpm level, shard depth} or {limit, retry-after s, rpm
-- level, tpm level, shard depth}: a tenant whose period spend reached its budget is refused
-- ('budget_exceeded', until the period ends); an admitted one is charged its reservation at
-- once (the settle replaces it with what was delivered), so nobody passes the budget by more
-- than one reservation.
local now = now_ms()
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local maxc, qmax, cost = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tenant, tier = ARGV[10], ARGV[11]
-- the buckets' levels (read-only here), returned with every answer: the x-ratelimit-*
-- headers are this call's view, so every gateway agrees
local lr = rpm > 0 and level_at(KEYS[1], rpm, now) or 0
local lt = tpm > 0 and level_at(KEYS[2], tpm, now) or 0
-- queue_max_len is per tier (queued + running): this shard's count, exact, plus the others'
-- as the caller last saw them
local own = tonumber(redis.call('HGET', KEYS[10], tier) or '0')
local function reject(reason, retry)
  redis.call('HINCRBY', KEYS[6], 'rejected:' .. reason, 1)
  return {reason, retry, tostring(lr), tostring(lt), own}
end
if own + tonumber(ARGV[16]) >= qmax then return reject('queue_full', 1) end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if maxc > 0 and redis.call('ZCARD', KEYS[3]) >= maxc then return reject('concurrency', 1) end
local function retry_s(level, c, limit)
  return math.max(1, math.ceil((math.min(c, limit) - level) * 60000 / limit / 1000))
end
local blim = tonumber(ARGV[17])
if blim > 0 and tonumber(redis.call('GET', KEYS[11]) or '0') >= blim then
  return reject('budget_exceeded', tonumber(ARGV[19]))
end
if rpm > 0 and lr < 1 then return reject('rpm', retry_s(lr, 1, rpm)) end
if tpm > 0 and lt < cost then return reject('tpm', retry_s(lt, cost, tpm)) end
if rpm > 0 then lr = lr - 1; store(KEYS[1], lr, now) end
if tpm > 0 then lt = lt - cost; store(KEYS[2], lt, now) end
if blim > 0 then
  redis.call('INCRBY', KEYS[11], ARGV[18])
  redis.call('EXPIRE', KEYS[11], tonumber(ARGV[19]) + 86400)
end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[7]), ARGV[6])
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[7]))
-- A tenant that becomes backlogged gets no banked credit (``policies.fair_queue.lift``):
-- its counter is lifted to the least backlogged counter, or with nobody backlogged to the
-- last picked tenant's. The value is copied as Redis stored it, so it stays exact.
if not redis.call('HGET', KEYS[8], tenant) then
  local mine = redis.call('HMGET', KEYS[9], tenant, ':last')
  local floor
  local names = redis.call('HKEYS', KEYS[8])
  for lo = 1, #names, 1000 do  -- one HMGET per 1000 tenants (unpack's stack is bounded)
    local cs = redis.call('HMGET', KEYS[9], unpack(names, lo, math.min(#names, lo + 999)))
    for _, c in ipairs(cs) do
      c = c or '0'
      if not floor or tonumber(c) < tonumber(floor) then floor = c end
    end
  end
  if not floor and mine[2] then floor = redis.call('HGET', KEYS[9], mine[2]) end
  if floor and tonumber(floor) > tonumber(mine[1] or '0') then
    redis.call('HSET', KEYS[9], tenant, floor)
  end
end
-- the tenant's stream exists when it is in the tier's tenant set (both go together, in the
-- scripts that delete an emptied stream); a stream found without its group is given it again
-- by the pick (NOGROUP), and a group that exists already is left as it is (BUSYGROUP)
if redis.call('SADD', KEYS[7], tenant) == 1 then
  redis.pcall('XGROUP', 'CREATE', KEYS[4], ARGV[13], '0', 'MKSTREAM')
end
local id
if ARGV[20] and ARGV[20] ~= '' then
  -- placement: 'p' names the worker PICK_LUA lets take the entry first
  id = redis.call('XADD', KEYS[4], '*', 't', ARGV[8], 'd', ARGV[9], 'n', ARGV[14],
    'w', ARGV[15], 'p', ARGV[20])
else
  id = redis.call('XADD', KEYS[4], '*', 't', ARGV[8], 'd', ARGV[9], 'n', ARGV[14],
    'w', ARGV[15])
end
redis.call('HINCRBY', KEYS[8], tenant, 1)
own = redis.call('HINCRBY', KEYS[10], tier, 1)
redis.call('HINCRBY', KEYS[10], 'b:' .. tier, 1)
redis.call('HSET', KEYS[5], 'tenant', tenant, 'tier', tier, 'state', 'queued', 'entry', id,
  'reserved', ARGV[5])
redis.call('EXPIRE', KEYS[5], tonumber(ARGV[12]))
redis.call('HINCRBY', KEYS[6], 'admitted', 1)
return {'ok', id, tostring(lr), tostring(lt), own}
"""

SETTLE_LUA = _BUCKET_LUA + """
-- KEYS: tpm, conc, stats, usage (the tenant-hour's ledger hash), usage tenants (set),
--       budget (the admission's period spend) [, a key to delete: the finished request's
--       output stream]
-- ARGV: tpm, reserved, actual, request_id, outcome, then the ledger row (``tenancy/ledger.py``;
--       prefix '' = ledger off): field prefix, the TTL of a new row's hash, tenant, prompt
--       tokens, cached prompt tokens, completion tokens delivered, error code ('' = none),
--       cost (micro-units, '' = no price), then the budget's reserved and actual charges
--       ('' = no budget)
-- The lease's ZREM decides: the refund, the budget's and the ledger row are written once,
-- together, or not at all, so the quota, the budget and the ledger cannot disagree.
if KEYS[7] then redis.call('DEL', KEYS[7]) end
if redis.call('ZREM', KEYS[2], ARGV[4]) == 0 then return 0 end
local tpm = tonumber(ARGV[1])
if tpm > 0 then
  local now = now_ms()
  local refund = math.max(0, tonumber(ARGV[2]) - tonumber(ARGV[3]))
  store(KEYS[1], math.min(tpm, level_at(KEYS[1], tpm, now) + refund), now)
end
redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
if ARGV[14] ~= '' and redis.call('EXISTS', KEYS[6]) == 1 then
  redis.call('INCRBY', KEYS[6], tonumber(ARGV[15]) - tonumber(ARGV[14]))
end
local p = ARGV[6]
if p ~= '' then
  -- metrics (``tenancy/ledger.py``): r requests, p prompt, c cached, d delivered, $ cost,
  -- e:{code} errors
  -- a row's first request sets the hash's TTL and lists the tenant (``ledger.py``)
  if redis.call('HINCRBY', KEYS[4], p .. 'r', 1) == 1 then
    redis.call('EXPIRE', KEYS[4], tonumber(ARGV[7]))
    redis.call('SADD', KEYS[5], ARGV[8])
  end
  if ARGV[9] ~= '0' then redis.call('HINCRBY', KEYS[4], p .. 'p', ARGV[9]) end
  if ARGV[10] ~= '0' then redis.call('HINCRBY', KEYS[4], p .. 'c', ARGV[10]) end
  if ARGV[11] ~= '0' then redis.call('HINCRBY', KEYS[4], p .. 'd', ARGV[11]) end
  if ARGV[12] ~= '' then redis.call('HINCRBY', KEYS[4], p .. 'e:' .. ARGV[12], 1) end
  if ARGV[13] ~= '' and ARGV[13] ~= '0' then
    redis.call('HINCRBY', KEYS[4], p .. '$', ARGV[13])
  end
end
return 1
"""


# -- the worker's claim, the drainer's backlog count and fair pick (``bus/queues.py``) -------


# KEYS: backlogged (hash), vtc (hash) of one tier in one shard, the shard's depth hash (its
#       'b:' .. tier count of entries not yet picked), the shard's pending index (set) and the
#       consumer's streams there (set; ``bus/pending.py``), then the candidates' streams
# ARGV: group, consumer, count, virtual time ('' = none), ceiling ('' = none), tier, placement
# wait (ms; 0 = preferences ignored), then the candidates (tenants, one per stream key, in order: those the caller's backlog view listed,
# less the tenants over their seat share, ``policies.tenant_seats``, whose entries stay queued)
# The fair pick (``policies.fair_queue``) among the candidates: a candidate's counter below the
# virtual time (the least counter the worker last picked at, over every shard) is first lifted
# to it, so a shard that sat idle banks no credit against the others. Then, up to ``count``
# times, the backlogged candidate with the least counter gives its next entry (XREADGROUP,
# which makes it pending for ``consumer``), and is charged its prompt tokens / weight (the
# entry's 'n' and 'w') on its counter and on its service (':s:' .. tenant, never lifted). Ties
# go to the least served, then the oldest next entry (read only on such a tie: the group's last
# delivered id, then the first entry after it), then the smaller id. Returns {stream key, entry
# id, fields, the counter it was picked at} per entry. A tenant whose stream had nothing left
# to deliver (the index outlived its entries) leaves the index; a stream without its group
# (NOGROUP) gets the group again. After the first entry, the pick stops at a candidate whose
# counter passed the ceiling (the least counter of the other shards: their turn). Also returns
# the candidates still backlogged and their counters, {tenant, counter, ...}, for the caller's
# view, and the milliseconds until the soonest entry held for another worker may be stolen
# ('' = none held). Placement (wait > 0): a candidate whose next entry names another worker
# ('p', set by ADMIT_LUA) and is younger than the wait (by its id's milliseconds, on Redis's
# clock) is passed over, the next candidate in fair order taken instead: the named worker
# takes it at once, anyone after the wait. A stream an entry was read from joins the shard's
# pending index and the consumer's set, in the same step as the read (member tier .. ':' ..
# tenant): a pending entry is always found by the reclaim. Every key it touches is declared:
# one slot on a cluster.
PICK_LUA = """
local group, consumer = ARGV[1], ARGV[2]
local wait_ms = tonumber(ARGV[7])
local out = {}
local cand, stream, passed = {}, {}, {}
local waiting = 'b:' .. ARGV[6]
local function unwait(n)
  if redis.call('HINCRBY', KEYS[3], waiting, -n) < 0 then redis.call('HSET', KEYS[3], waiting, 0) end
end
for i = 6, #KEYS do
  local t = ARGV[i + 2]
  cand[#cand + 1] = t
  stream[t] = KEYS[i]
end
-- the candidates' backlog counts, counters and services, read once (two HMGETs) and kept
-- here as the script changes them: back[t] (nil: not backlogged), ctr[t] and svc[t] hold
-- what Redis stores
local back, ctr, svc = {}, {}, {}
if #cand > 0 then
  local fields = {}
  for _, t in ipairs(cand) do fields[#fields + 1] = t; fields[#fields + 1] = ':s:' .. t end
  local qa = redis.call('HMGET', KEYS[1], unpack(cand))
  local vs = redis.call('HMGET', KEYS[2], unpack(fields))
  for i, t in ipairs(cand) do
    if qa[i] then back[t] = tonumber(qa[i]) end
    ctr[t] = vs[2 * i - 1] or nil
    svc[t] = vs[2 * i] or nil
  end
end
if ARGV[4] ~= '' then
  local vt = tonumber(ARGV[4])
  for _, t in ipairs(cand) do
    if back[t] and tonumber(ctr[t] or '0') < vt then
      redis.call('HSET', KEYS[2], t, ARGV[4])
      ctr[t] = ARGV[4]
    end
  end
end
local function next_entry(t)  -- the entry the group delivers next, or nil
  local key = stream[t]
  local groups = redis.pcall('XINFO', 'GROUPS', key)  -- an error: no stream
  if type(groups) ~= 'table' or groups.err then return nil end
  local last = '0-0'
  for _, g in ipairs(groups) do
    local name, id
    for j = 1, #g, 2 do
      if g[j] == 'name' then name = g[j + 1] elseif g[j] == 'last-delivered-id' then id = g[j + 1] end
    end
    if name == group then last = id end
  end
  return redis.call('XRANGE', key, '(' .. last, '+', 'COUNT', 1)[1]
end
local heads = {}  -- head(t), read once until t's entry is taken (ties recur: equal counters)
local function head(t)
  if heads[t] then return heads[t] end
  local nxt = next_entry(t)
  heads[t] = {math.huge, math.huge}
  if nxt then
    local ms, seq = string.match(nxt[1], '(%d+)-(%d+)')
    heads[t] = {tonumber(ms), tonumber(seq)}
  end
  return heads[t]
end
-- ms until another worker may take t's next entry (0: this consumer may take it now)
local now_ms
local function held_for(t)
  local nxt = next_entry(t)
  if not nxt then return 0 end
  local f = nxt[2]
  for j = 1, #f, 2 do
    if f[j] == 'p' then
      if f[j + 1] == consumer then return 0 end
      if not now_ms then
        local tm = redis.call('TIME')
        now_ms = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
      end
      return math.max(0, tonumber(string.match(nxt[1], '(%d+)-')) + wait_ms - now_ms)
    end
  end
  return 0
end
local held_ms
local function before(t, c, s, best, bc, bs)
  if c ~= bc then return c < bc end
  if s ~= bs then return s < bs end
  local ht, hb = head(t), head(best)
  if ht[1] ~= hb[1] then return ht[1] < hb[1] end
  if ht[2] ~= hb[2] then return ht[2] < hb[2] end
  return t < best
end
local last, indexed = nil, {}  -- the last tenant picked; the streams indexed in this call
while #out < tonumber(ARGV[3]) do
  local best, best_c, best_s
  for _, t in ipairs(cand) do
    if not passed[t] and back[t] then
      local c = tonumber(ctr[t] or '0')
      local s = tonumber(svc[t] or '0')
      if not best or before(t, c, s, best, best_c, best_s) then best, best_c, best_s = t, c, s end
    end
  end
  if not best then break end
  if ARGV[5] ~= '' and #out > 0 and best_c > tonumber(ARGV[5]) then break end
  local key = stream[best]
  local at = ctr[best] or '0'
  local got = false
  heads[best] = nil
  local held = wait_ms > 0 and held_for(best) or 0
  if held > 0 then
    passed[best] = true  -- its entry waits for its worker: the next candidate in fair order
    held_ms = math.min(held_ms or held, held)
  else
    got = redis.pcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', 1, 'STREAMS', key, '>')
    if type(got) == 'table' and got.err then
      -- NOGROUP: no stream (nothing to give), or the stream came back without its group
      -- (Redis restored partly): recreate it
      got = false
      if redis.call('EXISTS', key) == 1 then
        redis.call('XGROUP', 'CREATE', key, group, '0')
        got = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', 1, 'STREAMS', key, '>')
      end
    end
  end
  if held > 0 then  -- nothing was read: the tenant stays backlogged
  elseif not got or #got == 0 then
    unwait(back[best])
    redis.call('HDEL', KEYS[1], best)
    back[best] = nil
  else
    unwait(1)
    back[best] = redis.call('HINCRBY', KEYS[1], best, -1)
    if back[best] <= 0 then
      redis.call('HDEL', KEYS[1], best)
      back[best] = nil
    end
    local entry = got[1][2][1]
    local f, n, w = entry[2], 0, 1
    for j = 1, #f, 2 do
      if f[j] == 'n' then n = tonumber(f[j + 1]) elseif f[j] == 'w' then w = tonumber(f[j + 1]) end
    end
    local cost = string.format('%.17g', n / w)
    ctr[best] = redis.call('HINCRBYFLOAT', KEYS[2], best, cost)
    svc[best] = redis.call('HINCRBYFLOAT', KEYS[2], ':s:' .. best, cost)
    last = best
    if not indexed[best] then
      indexed[best] = true
      redis.call('SADD', KEYS[4], ARGV[6] .. ':' .. best)
      redis.call('SADD', KEYS[5], ARGV[6] .. ':' .. best)
    end
    out[#out + 1] = {key, entry[1], f, at}
  end
end
if last then redis.call('HSET', KEYS[2], ':last', last) end
local left = {}
for _, t in ipairs(cand) do
  if back[t] then
    left[#left + 1] = t
    left[#left + 1] = ctr[t] or '0'
  end
end
return {out, left, held_ms and tostring(held_ms) or ''}
"""

# -- one engine step's outputs (``worker/writer.py``, through ``queues.py``) -----------------

# KEYS (one shard: the writer sends a call per shard): stats, depth, the pending index
#       (``bus/pending.py``: a deleted stream leaves it), then per request: req,
#       out, queue, vtc (its tier's counters), usage (its ledger hash, ``tenancy/ledger.py``),
#       the tier's tenant set
# ARGV: ttl, (unused), group, token type, finish type, the TTL of a new ledger row's hash,
#       then per request: finished (0/1), reader gone (0/1), token data ('' = none), finish data,
#       entry id, outcome, tenant, charge (output tokens / weight for the fair queue; '' =
#       none), ledger field prefix ('' = none), completion tokens computed, tier, refresh
#       (1: a token write sets the stream's TTL and the 'sent' mark)
# A request's final write and its state change are one step against the cancel script
# (``cancel.py``): a reader that left before the finish was written (its cancel mark is
# 'gone') gets its stream deleted, not recreated until the TTL. A stream's TTL is set by the
# writes the writer marks 'refresh' (the first, then one each third of the TTL: no TTL read
# per token), and set afresh with the finish; a stream recreated after a reader's DEL gets one
# at its next refresh, and is deleted by the finish (its cancel mark is 'gone').
# The first write also marks the request 'sent' (the claim script's 'lost': its reader has
# output, even once a held-back stream has expired). A finish is written once: a retried write
# whose first try was applied finds the request finished and only acks again. The output
# tokens written are charged to the tenant's counter and its service, ':s:' .. tenant
# (``policies.fair_queue``), as they go. The finish adds the completion tokens computed to the
# request's ledger row (its cancelled work is computed - delivered, the gateway's settle
# writes the delivered), once, with the finish.
STEP_LUA = """
local ttl, group = tonumber(ARGV[1]), ARGV[3]
for i = 0, (#KEYS - 3) / 6 - 1 do
  local req, out, queue = KEYS[4 + 6 * i], KEYS[5 + 6 * i], KEYS[6 + 6 * i]
  local a = 7 + 12 * i
  local gone, tok = ARGV[a + 1] == '1', ARGV[a + 2]
  local fresh = true
  if ARGV[a] == '1' then
    -- finished already: a write whose reply was lost, written again (only ack again)
    local h = redis.call('HMGET', req, 'state', 'cancel')
    if h[1] ~= 'finished' then
      if gone or h[2] == 'gone' then
        redis.call('DEL', out)
      else
        if tok ~= '' then redis.call('XADD', out, '*', 't', ARGV[4], 'd', tok) end
        redis.call('XADD', out, '*', 't', ARGV[5], 'd', ARGV[a + 3])
        redis.call('EXPIRE', out, ttl)
      end
      redis.call('HSET', req, 'state', 'finished')
      redis.call('HINCRBY', KEYS[1], ARGV[a + 5], 1)
      if ARGV[a + 8] ~= '' and redis.call('HINCRBY', KEYS[8 + 6 * i], ARGV[a + 8] .. 'x',
                                          ARGV[a + 9]) == tonumber(ARGV[a + 9]) then
        redis.call('EXPIRE', KEYS[8 + 6 * i], tonumber(ARGV[6]))  -- a new row: its TTL
      end
    else
      fresh = false
    end
    redis.call('XACK', queue, group, ARGV[a + 4])
    if redis.call('XDEL', queue, ARGV[a + 4]) == 1
        and redis.call('HINCRBY', KEYS[2], ARGV[a + 10], -1) < 0 then
      redis.call('HSET', KEYS[2], ARGV[a + 10], 0)
    end
    if redis.call('XLEN', queue) == 0 then  -- an idle tenant's stream goes, and its tenant
      redis.call('DEL', queue)              -- leaves the sets: idle tenants cost no reclaim
      redis.call('SREM', KEYS[9 + 6 * i], ARGV[a + 6])
      redis.call('SREM', KEYS[3], ARGV[a + 10] .. ':' .. ARGV[a + 6])
    end
  elseif not gone and tok ~= '' then
    redis.call('XADD', out, '*', 't', ARGV[4], 'd', tok)
    if ARGV[a + 11] == '1' then
      redis.call('EXPIRE', out, ttl)
      redis.call('HSET', req, 'sent', '1')  -- the reader has output: a reclaim must not rerun it
    end
  end
  if fresh and ARGV[a + 7] ~= '' then
    redis.call('HINCRBYFLOAT', KEYS[7 + 6 * i], ARGV[a + 6], ARGV[a + 7])
    redis.call('HINCRBYFLOAT', KEYS[7 + 6 * i], ':s:' .. ARGV[a + 6], ARGV[a + 7])
  end
end
"""
