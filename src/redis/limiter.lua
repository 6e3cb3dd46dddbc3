-- slidegate's sliding-window admission, executed atomically by Redis, for one key or for a
-- batch of keys checked one after the other (as separate calls would be, in this order).
--
-- KEYS: per entry, the key's windows (one string) and its hash of replica bookkeeping.
--       Both carry the key's hash tag (so they share a Cluster slot; a batch of several
--       keys is only sent to a standalone server).
-- ARGV: now in ms ('' = the server's TIME), ttl in ms, number of limits, then per limit:
--       max, window ms, slot ms, strict (1/0); then per entry: mode ('check' | 'peek' |
--       'add' | 'push') and cost; an 'add' (alone in its call) is followed by the caller's
--       id and the entry's sequence number (an 'add' whose reply was lost is retried with
--       the same number and applied once).
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
-- The bookkeeping hash: 'n' the units hybrid replicas pushed (they sync through its
-- increments; their pushes count in the windows string too), and
-- 'a:<client>' the last 'add' sequence number applied per client.
--
-- Returns, per entry, {kind, limit, remaining, retry_ms, now_ms}, one flat list; kind 0 =
-- admitted, 1 = refused by `limit`, 2 = cost above that limit's max, 3 = an entry error
-- {3, code, 0, 0, now_ms} that fails this entry alone: code 1 an unknown mode, 2 a cost
-- that is not a non-negative integer, 3 the windows key holds another type (left as it
-- is), or a push's bookkeeping does (or its total would overflow). A push that the server
-- refuses for now (out of memory, a replica, too few replicas, a failed save) fails the
-- call with the server's error, having written nothing. 'push' adds cost to 'n' and
-- counts it in every limit without checking, and returns {n, now_ms, used, 1, 0}: `used`
-- the most units any limit's window holds after it (a pull, cost 0, writes nothing).
-- 'add' counts cost in
-- every limit without checking (units a fallback admitted while Redis was unreachable)
-- and returns {0, 0, 0, 0, now_ms}.

local server_now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  server_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  server_now = tonumber(ARGV[1])
end
local ttl = tonumber(ARGV[2])
local nl = tonumber(ARGV[3])

-- The limits, the same for every entry; `length` is a key's string for them (a string
-- laid out for other limits is no state).
local limits = {}
local length = 8 + nl * 24
for i = 0, nl - 1 do
  local b = 4 + i * 4
  local l = { max = tonumber(ARGV[b]), p = tonumber(ARGV[b + 2]), strict = ARGV[b + 3] == '1' }
  l.n = tonumber(ARGV[b + 1]) / l.p
  l.head = 9 + i * 24
  l.ring = length + 1
  length = length + (l.n + 1) * 8
  limits[i] = l
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

-- The units of closed slot s < K of window `w`, as stored (before its move to K).
local function stored(state, l, w, s)
  if s == w.k then return w.cur end
  if s > w.k or s < w.k - l.n or not state then return 0 end
  return (struct.unpack('<d', state, l.ring + (s % (l.n + 1)) * 8))
end

-- Limit l's window of `state` at `now`, as if moved to the current slot K (nothing written).
local function view(state, l, now)
  local K = math.floor(now / l.p)
  local k, cur, sum = K, 0, 0
  if state then k, cur, sum = struct.unpack('<ddd', state, l.head) end
  -- One constructor: a table grown field by field would be rehashed as it grows.
  local w = { K = K, e = now - K * l.p, k = k, cur = cur, sum = sum, now_cur = cur, new_sum = sum,
              whole = sum + cur, oldest = 0 }
  if K ~= k then
    local carried = 0
    if K - k < l.n then
      carried = sum + cur
      for s = k - l.n + 1, K - l.n do
        carried = carried - stored(state, l, w, s)
      end
    end
    w.now_cur, w.new_sum, w.whole = 0, carried, carried
  end
  w.oldest = stored(state, l, w, K - l.n)
  return w
end

local function weight(l, w)
  if l.strict then return l.p end
  return l.p - w.e
end

local function admits(l, w, units)
  local used = w.whole + units
  if used > l.max then return false end
  return w.oldest * weight(l, w) <= (l.max - used) * l.p
end

-- The units limit l's window counts after `units` more, the oldest slot by its weight
-- (rounded up, as `room` counts it).
local function used(l, w, units)
  return w.whole + units + ceil_div(w.oldest * weight(l, w), l.p)
end

-- Whole units still free after `units` more, at least 0.
local function room(l, w, units)
  local free = l.max - w.whole - units
  if free <= 0 then return 0 end
  if w.oldest == 0 then return free end
  local r = free - ceil_div(w.oldest * weight(l, w), l.p)
  if r < 0 then return 0 end
  return r
end

-- The earliest time (ms) at which `units` fit if nothing else is admitted: the window
-- slides slot by slot, and within a slot the interpolated count falls linearly.
local function earliest(state, l, w, units)
  -- c[1] is slot K-n (the oldest, partly covered), c[n+1] slot K.
  local c = {}
  for idx = 1, l.n do
    c[idx] = stored(state, l, w, w.K - l.n + idx - 1)
  end
  c[l.n + 1] = w.now_cur
  local allowed = l.max - units
  local whole = w.whole
  for d = 0, l.n + 1 do
    if d > 0 and d + 1 <= l.n + 1 then
      -- Slot K+d-n leaves the whole part and becomes the oldest.
      whole = whole - c[d + 1]
    end
    local oldest = 0
    if d + 1 <= l.n + 1 then oldest = c[d + 1] end
    local from = 0
    if d == 0 then from = w.e end
    if whole <= allowed then
      if l.strict or oldest == 0 then
        if whole + oldest <= allowed or oldest == 0 then
          return (w.K + d) * l.p + from
        end
      else
        local need = l.p - floor_div((allowed - whole) * l.p, oldest)
        if need < from then need = from end
        if need < l.p then return (w.K + d) * l.p + need end
      end
    end
  end
  return (w.K + l.n + 2) * l.p
end

-- Writes `key`'s windows moved to K with `units` more in slot K, and the time, with the
-- expiry.
local function count(key, state, windows, now, units)
  local parts = { struct.pack('<d', now) }
  for i = 0, nl - 1 do
    local w = windows[i]
    parts[#parts + 1] = struct.pack('<ddd', w.K, w.now_cur + units, w.new_sum)
  end
  for i = 0, nl - 1 do
    local l, w = limits[i], windows[i]
    local len = (l.n + 1) * 8
    local ring
    if not state then
      ring = string.rep('\0', len)
    else
      ring = string.sub(state, l.ring, l.ring + len - 1)
      if w.K - w.k > l.n + 1 then
        ring = string.rep('\0', len)
      elseif w.K > w.k then
        -- Slot k closes with its count; the skipped slots k+1 .. K-1 are empty.
        local moved = w.K - w.k
        local fresh = struct.pack('<d', w.cur) .. string.rep('\0', (moved - 1) * 8)
        local at = (w.k % (l.n + 1)) * 8
        local head = math.min(moved * 8, len - at)
        ring = string.sub(ring, 1, at) .. string.sub(fresh, 1, head) .. string.sub(ring, at + head + 1)
        if head < moved * 8 then
          local rest = moved * 8 - head
          ring = string.sub(fresh, head + 1) .. string.sub(ring, rest + 1)
        end
      end
    end
    parts[#parts + 1] = ring
  end
  redis.call('SET', key, table.concat(parts), 'PX', ttl)
end

-- Remaining after `units`, over all limits, and the limit with the least.
local function least_room(windows, units)
  local best, at = nil, 0
  for i = 0, nl - 1 do
    local r = room(limits[i], windows[i], units)
    if best == nil or r < best then best, at = r, i end
  end
  return best, at
end

-- Whether an error of a push's HINCRBY holds whatever the server's state: the bookkeeping
-- holds another type, or its 'n' is not an integer or would overflow.
local function lasting(err)
  return string.sub(err, 1, 9) == 'WRONGTYPE'
    or string.find(err, '^ERR .*not an integer') ~= nil
    or string.find(err, '^ERR .*overflow') ~= nil
end

local out = {}

local function reply(a, b, c, d, e)
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = a, b, c, d, e
end

-- One entry, whose windows string (or false) is `state`: appends its five replies to `out`,
-- or returns the error that fails the whole call.
local function run(key, book, state, mode, cost, extra)
  if state and #state ~= length then state = false end
  local now = server_now
  if state then
    local seen = struct.unpack('<d', state, 1)
    if seen > now then now = seen end
  end
  local windows = {}
  for i = 0, nl - 1 do
    windows[i] = view(state, limits[i], now)
  end
  if mode == 'push' then
    -- pcall: pushes share calls, and an error would end the script after the entries
    -- before this one were applied, which the caller would then push again. An error no
    -- retry changes fails this entry alone. Any other is a server refusing writes for now
    -- (OOM, READONLY, NOREPLICAS, MISCONF): it fails the call with that error, which the
    -- caller retries with every unit. Such an error comes at the call's first write (Redis
    -- refuses a script's first write only when out of memory, and a replica or a missing
    -- quorum refuses every write), so nothing before it was applied.
    local total = redis.pcall('HINCRBY', book, 'n', cost)
    if type(total) == 'table' then
      if lasting(total.err) then return reply(3, 3, 0, 0, now) end
      return total
    end
    redis.call('PEXPIRE', book, ttl)
    -- The units also count in the key's windows, so that a replica's first sync of the key
    -- learns what they hold (the running total 'n' says nothing about the window).
    if cost > 0 then count(key, state, windows, now, cost) end
    local most = 0
    for i = 0, nl - 1 do
      local u = used(limits[i], windows[i], cost)
      if u > most then most = u end
    end
    return reply(total, now, most, 1, 0)
  end
  if mode == 'add' then
    local field = 'a:' .. (extra[1] or '')
    if tonumber(extra[2] or '0') > tonumber(redis.call('HGET', book, field) or '0') then
      redis.call('HSET', book, field, extra[2])
      redis.call('PEXPIRE', book, ttl)
      if cost > 0 then count(key, state, windows, now, cost) end
    end
    return reply(0, 0, 0, 0, now)
  end
  for i = 0, nl - 1 do
    if cost > limits[i].max then
      return reply(2, i, (least_room(windows, 0)), 0, now)
    end
  end
  local all = true
  for i = 0, nl - 1 do
    if not admits(limits[i], windows[i], cost) then all = false end
  end
  if all then
    if mode == 'check' and cost > 0 then
      count(key, state, windows, now, cost)
    end
    local r, at = least_room(windows, cost)
    return reply(0, at, r, 0, now)
  end
  -- Refused: name the limit that frees up last (the first of them on a tie).
  local worst, at = nil, 0
  for i = 0, nl - 1 do
    if not admits(limits[i], windows[i], cost) then
      local t = earliest(state, limits[i], windows[i], cost)
      if worst == nil or t > worst then worst, at = t, i end
    end
  end
  return reply(1, at, (least_room(windows, 0)), worst - now, now)
end

local modes = { check = true, peek = true, add = true, push = true }

-- Every entry's windows in one read, then the entries in order. A key listed twice is read
-- again (the first may have written it). MGET answers nil for a key of another type: such
-- a key (found by TYPE, asked only when there is no string) is an entry error, never
-- overwritten.
local entries = #KEYS / 2
local names = {}
for j = 1, entries do names[j] = KEYS[j * 2 - 1] end
local states = redis.call('MGET', unpack(names))
local done = {}
local first = 4 + nl * 4
for j = 0, entries - 1 do
  local key = KEYS[j * 2 + 1]
  local state = states[j + 1]
  if done[key] then
    state = redis.pcall('GET', key)
    if type(state) == 'table' then state = false end
  end
  done[key] = true
  local a = first + j * 2
  local mode, cost = ARGV[a], tonumber(ARGV[a + 1])
  if not modes[mode] then
    reply(3, 1, 0, 0, server_now)
  elseif not cost or cost < 0 or cost ~= math.floor(cost) then
    reply(3, 2, 0, 0, server_now)
  elseif not state and redis.call('TYPE', key)['ok'] ~= 'none' then
    reply(3, 3, 0, 0, server_now)
  else
    local failed = run(key, KEYS[j * 2 + 2], state, mode, cost, { ARGV[a + 2], ARGV[a + 3] })
    if failed then return failed end
  end
end
return out
