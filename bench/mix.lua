-- wrk script: POST one of the bodies in $BENCH_BODIES_FILE (one per line) per request, each
-- thread from its own random start; print a JSON summary at the end (as post.lua does).
local bodies = {}
for line in io.lines(os.getenv("BENCH_BODIES_FILE")) do
  if #line > 0 then table.insert(bodies, line) end
end
local headers = {["Content-Type"] = "application/json"}
local non200 = 0
local next_body = 1

init = function() math.randomseed(seed or 1); next_body = math.random(1, #bodies) end

request = function()
  next_body = next_body % #bodies + 1
  return wrk.format("POST", nil, headers, bodies[next_body])
end

response = function(status, headers, body)
  if status ~= 200 then non200 = non200 + 1 end
end

local threads = {}
setup = function(thread)
  thread:set("seed", math.random(1, 1000000))
  table.insert(threads, thread)
end

done = function(summary, latency, requests)
  local bad = 0
  for _, t in ipairs(threads) do bad = bad + (t:get("non200") or 0) end
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "non200": %d, "socket_errors": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration, bad, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
