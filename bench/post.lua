-- wrk script: POST JSON bodies and print a JSON summary at the end. The body is the one in
-- $BENCH_BODY_FILE (formatted once by wrk), or, with $BENCH_BODIES_FILE, one line of that file
-- per request in turn, each thread from its own random start.
local bodies = {}
local many = os.getenv("BENCH_BODIES_FILE")
if many then
  for line in io.lines(many) do
    if #line > 0 then table.insert(bodies, line) end
  end
  local headers = {["Content-Type"] = "application/json"}
  local next_body = 1
  init = function() math.randomseed(seed or 1); next_body = math.random(1, #bodies) end
  request = function()
    next_body = next_body % #bodies + 1
    return wrk.format("POST", nil, headers, bodies[next_body])
  end
else
  local f = assert(io.open(os.getenv("BENCH_BODY_FILE"), "rb"))
  wrk.method = "POST"
  wrk.body = f:read("*a")
  f:close()
  wrk.headers["Content-Type"] = "application/json"
end

local non200 = 0
response = function(status, headers, body)
  if status ~= 200 then non200 = non200 + 1 end
end

-- wrk runs response() in each thread's own Lua state; collect per-thread counts at the end.
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
