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
  -- A new connection a request ($BENCH_CLOSE set): what accepting costs.
  if os.getenv("BENCH_CLOSE") then wrk.headers["Connection"] = "close" end
  -- The Open Inference Protocol's binary tensors: a JSON header of this many bytes, then data.
  local header_length = os.getenv("BENCH_HEADER_LENGTH")
  if header_length then
    wrk.headers["Content-Type"] = "application/octet-stream"
    wrk.headers["Inference-Header-Content-Length"] = header_length
  end
end

setup = function(thread)
  thread:set("seed", math.random(1, 1000000))
end

-- wrk counts the answers with a status of 400 or more itself (errors.status): "http_errors".
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "http_errors": %d, "socket_errors": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
end
