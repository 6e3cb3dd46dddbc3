-- slidegate's sliding-window admission, executed atomically by Redis for one key.
--
-- KEYS[1]: the key's windows, one string; KEYS[2]: its hash of replica bookkeeping. Both
--          carry the same hash tag (the caller's), so they live on one Cluster slot.
-- ARGV: mode ('check' | 'peek' | 'add' | 'push'), now in ms ('' = the server's TIME),
--       cost, ttl in ms, number of limits, then per limit: max, window ms, slot ms,
--       strict (1/0); then, for 'add', the caller's id and the entry's sequence number
--       (an 'add' whose reply was lost is retried with the same number and applied once).
--
-- The windows string holds doubles (exact integers below 2^53), little-endian:
--   t                          the latest time seen, ms (time never runs backwards);
--   per limit i: k, cur, sum   the current slot, its units, and the units of the closed
--                              slots k-n+1 .. k-1 (those wholly inside slot k's window);
--   per limit i: n+1 entries   the ring: slot s's units at position s mod (n+1), for the
--                              closed slots k-n .. k-1 (n = window / slot).
-- A check reads t, k, cur, sum and the oldest slot's entry: O(limits), not O(slots). A move
-- to a later slot carries `sum` over (plus the closed slot, minus those that left), reading
-- one entry per slot moved. Only a refusal walks the ring, to find `retry_after`. An
-- admission writes the string back with one SET (which also sets the expiry); a refusal
-- writes nothing.
--
-- The bookkeeping hash: 'n' the units hybrid replicas pushed (they sync through it), and
-- 'a:<client>' the last 'add' sequence number applied per client.
--
-- Returns {kind, limit, remaining, retry_ms, now_ms}; kind 0 = admitted, 1 = refused by
-- `limit`, 2 = cost above that limit's max. 'push' adds cost to 'n' only and returns
-- {n, now_ms}. 'add' counts cost in every limit without checking (units a fallback
-- admitted while Redis was unreachable) and returns {0, 0, 0, 0, now_ms}.

local key, book = KEYS[1], KEYS[2]
local mode = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local cost = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local nl = tonumber(ARGV[5])
-- The string's length for these limits: one laid out for other limits is no state.
local length = 8 + nl * 24
for i = 0, nl - 1 do
  length = length + (tonumber(ARGV[7 + i * 4]) / tonumber(ARGV[8 + i * 4]) + 1) * 8
end
local state = redis.call('GET', key)
if state and #state ~= length then state = false end
if state then
  local seen = struct.unpack('<d', state, 1)
  if seen > now then now = seen end
end

if mode == 'push' then
  local total = redis.call('HINCRBY', book, 'n', cost)
  redis.call('PEXPIRE', book, ttl)
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

-- Each limit at `now`, as if moved to slot K (nothing written yet).
local limits = {}
local ring_at = 9 + nl * 24
for i = 0, nl - 1 do
  local b = 6 + i * 4
  local l = { max = tonumber(ARGV[b]), p = tonumber(ARGV[b + 2]), strict = ARGV[b + 3] == '1' }
  l.n = tonumber(ARGV[b + 1]) / l.p
  l.K = math.floor(now / l.p)
  l.e = now - l.K * l.p
  l.ring = ring_at
  ring_at = ring_at + (l.n + 1) * 8
  if state then
    l.k, l.cur, l.sum = struct.unpack('<ddd', state, 9 + i * 24)
  else
    l.k, l.cur, l.sum = l.K, 0, 0
  end
  limits[i] = l
end

-- The units of closed slot s < K, as stored (before the move to K).
local function stored(l, s)
  if s == l.k then return l.cur end
  if s > l.k or s < l.k - l.n or not state then return 0 end
  return (struct.unpack('<d', state, l.ring + (s % (l.n + 1)) * 8))
end

-- Slot K's units, the units of the closed slots wholly inside its window, the oldest.
for i = 0, nl - 1 do
  local l = limits[i]
  if l.K == l.k then
    l.whole = l.sum + l.cur
    l.now_cur = l.cur
    l.new_sum = l.sum
  else
    local sum = 0
    if l.K - l.k < l.n then
      sum = l.sum + l.cur
      for s = l.k - l.n + 1, l.K - l.n do
        sum = sum - stored(l, s)
      end
    end
    l.now_cur = 0
    l.new_sum = sum
    l.whole = sum
  end
  l.oldest = stored(l, l.K - l.n)
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
  -- c[1] is slot K-n (the oldest, partly covered), c[n+1] slot K.
  local c = {}
  for idx = 1, l.n do
    c[idx] = stored(l, l.K - l.n + idx - 1)
  end
  c[l.n + 1] = l.now_cur
  local allowed = l.max - units
  local whole = l.whole
  for d = 0, l.n + 1 do
    if d > 0 and d + 1 <= l.n + 1 then
      -- Slot K+d-n leaves the whole part and becomes the oldest.
      whole = whole - c[d + 1]
    end
    local oldest = 0
    if d + 1 <= l.n + 1 then oldest = c[d + 1] end
    local from = 0
    if d == 0 then from = l.e end
    if whole <= allowed then
      if l.strict or oldest == 0 then
        if whole + oldest <= allowed or oldest == 0 then
          return (l.K + d) * l.p + from
        end
      else
        local need = l.p - floor_div((allowed - whole) * l.p, oldest)
        if need < from then need = from end
        if need < l.p then return (l.K + d) * l.p + need end
      end
    end
  end
  return (l.K + l.n + 2) * l.p
end

-- Writes every limit moved to K with `units` more in slot K, and the time, with the expiry.
local function count(units)
  local parts = { struct.pack('<d', now) }
  for i = 0, nl - 1 do
    local l = limits[i]
    parts[#parts + 1] = struct.pack('<ddd', l.K, l.now_cur + units, l.new_sum)
  end
  for i = 0, nl - 1 do
    local l = limits[i]
    local len = (l.n + 1) * 8
    local ring
    if state then
      ring = string.sub(state, l.ring, l.ring + len - 1)
    else
      ring = string.rep('\0', len)
    end
    if state and l.K > l.k then
      -- Slot k closes with its count; the skipped slots k+1 .. K-1 are empty (at most
      -- n+1 of them matter: the ring's length).
      local moved = math.min(l.K - l.k, l.n + 1)
      local fresh = struct.pack('<d', l.cur) .. string.rep('\0', (moved - 1) * 8)
      if l.K - l.k > l.n + 1 then
        fresh = string.rep('\0', len)
        moved = l.n + 1
      end
      local at = (l.k % (l.n + 1)) * 8
      if l.K - l.k > l.n + 1 then at = 0 end
      local head = math.min(moved * 8, len - at)
      ring = string.sub(ring, 1, at) .. string.sub(fresh, 1, head) .. string.sub(ring, at + head + 1)
      if head < moved * 8 then
        local rest = moved * 8 - head
        ring = string.sub(fresh, head + 1) .. string.sub(ring, rest + 1)
      end
    end
    parts[#parts + 1] = ring
  end
  redis.call('SET', key, table.concat(parts), 'PX', ttl)
end

if mode == 'add' then
  local client, seq = ARGV[6 + nl * 4], tonumber(ARGV[7 + nl * 4] or '0')
  local field = 'a:' .. (client or '')
  if seq > tonumber(redis.call('HGET', book, field) or '0') then
    redis.call('HSET', book, field, seq)
    redis.call('PEXPIRE', book, ttl)
    if cost > 0 then count(cost) end
  end
  return {0, 0, 0, 0, now}
end

-- Remaining after `units`, over all limits.
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
