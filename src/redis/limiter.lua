-- slidegate's sliding-window admission, executed atomically by Redis for one key.
--
-- KEYS[1]: the key's hash (hash-tagged by the caller, so it lives on one Cluster slot).
-- ARGV: mode ('check' | 'peek' | 'add' | 'push'), now in ms ('' = the server's TIME),
--       cost, ttl in ms, number of limits, then per limit: max, window ms, slot ms,
--       strict (1/0); then, for 'add', the caller's id and the entry's sequence number
--       (an 'add' whose reply was lost is retried with the same number and applied once).
-- Hash fields: 't' the latest time seen (ms; never rewound), 'n' the units hybrid replicas
-- pushed (they sync through it), 'i:<slot>' the units of limit i in that slot,
-- 'i:last' the last slot written for limit i (older, out-of-window slots are deleted).
--
-- Returns {kind, limit, remaining, retry_ms, now_ms}; kind 0 = admitted, 1 = refused by
-- `limit`, 2 = cost above that limit's max. 'push' adds cost to 'n' only and returns
-- {n, now_ms}. 'add' counts cost in every limit without checking (units a fallback
-- admitted while Redis was unreachable) and returns {0, 0, 0, 0, now_ms}.
--
-- Every number stays an integer below 2^53 (the caller checks max x slot ms at build
-- time), so double-precision arithmetic is exact.

local key = KEYS[1]
local mode = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local seen = tonumber(redis.call('HGET', key, 't') or '0')
if seen > now then
  now = seen
end
local cost = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local nl = tonumber(ARGV[5])

if mode == 'push' then
  local total = redis.call('HINCRBY', key, 'n', cost)
  redis.call('HSET', key, 't', now)
  redis.call('PEXPIRE', key, ttl)
  return {total, now}
end

local function floor_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

local function ceil_div(a, b)
  local q = floor_div(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- Each limit's window at `now`: c[1] is slot k-n (the oldest, partly covered), c[n+1] slot k.
local limits = {}
for i = 0, nl - 1 do
  local b = 6 + i * 4
  local l = {
    max = tonumber(ARGV[b]),
    p = tonumber(ARGV[b + 2]),
    strict = ARGV[b + 3] == '1',
  }
  l.n = tonumber(ARGV[b + 1]) / l.p
  l.k = math.floor(now / l.p)
  l.e = now - l.k * l.p
  local fields = {}
  for s = l.k - l.n, l.k do
    fields[#fields + 1] = i .. ':' .. s
  end
  fields[#fields + 1] = i .. ':last'
  local values = redis.call('HMGET', key, unpack(fields))
  l.last = tonumber(values[#values] or '-1')
  l.c = {}
  l.whole = 0
  for idx = 1, #values - 1 do
    l.c[idx] = tonumber(values[idx] or '0')
    if idx > 1 then l.whole = l.whole + l.c[idx] end
  end
  l.oldest = l.c[1]
  limits[i] = l
end

local function weight(l)
  if l.strict then return l.p end
  return l.p - l.e
end

local function admits(l, units)
  local used = l.whole + units
  if used > l.max then return false end
  return l.oldest * weight(l) <= (l.max - used) * l.p
end

-- Whole units still free after `units` more, at least 0.
local function room(l, units)
  local free = l.max - l.whole - units
  if free <= 0 then return 0 end
  if l.oldest == 0 then return free end
  local r = free - ceil_div(l.oldest * weight(l), l.p)
  if r < 0 then return 0 end
  return r
end

-- The earliest time (ms) at which `units` fit if nothing else is admitted: the window
-- slides slot by slot, and within a slot the interpolated count falls linearly.
local function earliest(l, units)
  local allowed = l.max - units
  local whole = l.whole
  for d = 0, l.n + 1 do
    if d > 0 then
      -- Slot k+d-n leaves the whole part and becomes the oldest.
      if d + 1 <= l.n + 1 then whole = whole - l.c[d + 1] end
    end
    local oldest = 0
    if d + 1 <= l.n + 1 then oldest = l.c[d + 1] end
    local from = 0
    if d == 0 then from = l.e end
    if whole <= allowed then
      if l.strict or oldest == 0 then
        if whole + oldest <= allowed or oldest == 0 then
          return (l.k + d) * l.p + from
        end
      else
        local need = l.p - floor_div((allowed - whole) * l.p, oldest)
        if need < from then need = from end
        if need < l.p then return (l.k + d) * l.p + need end
      end
    end
  end
  return (l.k + l.n + 2) * l.p
end

local function count(units)
  local sets = {'t', now}
  for i = 0, nl - 1 do
    local l = limits[i]
    redis.call('HINCRBY', key, i .. ':' .. l.k, units)
    local last = l.last
    if last >= 0 and last < l.k then
      -- Slots now wholly out of the window go (those before last-n went earlier).
      local stale = {}
      local top = math.min(last, l.k - l.n - 1)
      for s = math.max(last - l.n, 0), top do
        stale[#stale + 1] = i .. ':' .. s
      end
      if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
    end
    if last < l.k then
      sets[#sets + 1] = i .. ':last'
      sets[#sets + 1] = l.k
    end
  end
  redis.call('HSET', key, unpack(sets))
  redis.call('PEXPIRE', key, ttl)
end

if mode == 'add' then
  local client, seq = ARGV[6 + nl * 4], tonumber(ARGV[7 + nl * 4] or '0')
  local field = 'a:' .. (client or '')
  if seq > tonumber(redis.call('HGET', key, field) or '0') then
    redis.call('HSET', key, field, seq)
    if cost > 0 then count(cost) end
  end
  return {0, 0, 0, 0, now}
end

-- Remaining for cost 0, over all limits.
local function least_room(units)
  local best, at = nil, 0
  for i = 0, nl - 1 do
    local r = room(limits[i], units)
    if best == nil or r < best then best, at = r, i end
  end
  return best, at
end

for i = 0, nl - 1 do
  if cost > limits[i].max then
    local r = least_room(0)
    return {2, i, r, 0, now}
  end
end

local all = true
for i = 0, nl - 1 do
  if not admits(limits[i], cost) then all = false end
end

if all then
  if mode == 'check' and cost > 0 then
    count(cost)
  end
  local r, at = least_room(cost)
  return {0, at, r, 0, now}
end

-- Refused: name the limit that frees up last (the first of them on a tie).
local worst, at = nil, 0
for i = 0, nl - 1 do
  if not admits(limits[i], cost) then
    local t = earliest(limits[i], cost)
    if worst == nil or t > worst then worst, at = t, i end
  end
end
local r = least_room(0)
return {1, at, r, worst - now, now}
