-- Runs the Argo CD health checks in examples/argocd/health against status fixtures.
--
--   lua run.lua HEALTH_DIR FIXTURE.lua...
--
-- A fixture is a Lua file returning
--   { check = "inferencepool" | "tierpolicy", expected = { status = ..., message = ... },
--     obj = { apiVersion = ..., kind = ..., metadata = ..., spec = ..., status = ... } }
-- The check runs the way Argo CD runs it: `obj` is the only global besides a sandbox of the
-- standard libraries Argo CD offers (no os, io, require, load), numbers are floats as they
-- are after JSON decoding, and the chunk returns { status, message }.
-- Prints one line per fixture; exits 1 if any result differs from what is expected.

local health_dir = arg[1]
local failures, total = 0, 0

-- JSON numbers reach Argo CD's Lua as float64: turn every integer into a float.
local function floats(v)
  if type(v) == "number" then
    return v + 0.0
  elseif type(v) == "table" then
    local out = {}
    for k, x in pairs(v) do
      out[k] = floats(x)
    end
    return out
  end
  return v
end

local function sandbox(obj)
  return {
    obj = obj,
    ipairs = ipairs, pairs = pairs, next = next, select = select, type = type,
    tostring = tostring, tonumber = tonumber, error = error, pcall = pcall, assert = assert,
    unpack = unpack or table.unpack,
    string = string, table = table, math = math,
  }
end

local function run_check(path, obj)
  local env = sandbox(obj)
  local chunk, err
  if setfenv then -- Lua 5.1
    chunk, err = loadfile(path)
    if chunk then setfenv(chunk, env) end
  else
    chunk, err = loadfile(path, "t", env)
  end
  if not chunk then
    error("cannot load " .. path .. ": " .. tostring(err))
  end
  return chunk()
end

local valid = { Healthy = true, Progressing = true, Degraded = true, Suspended = true, Missing = true, Unknown = true }

for i = 2, #arg do
  local fixture_path = arg[i]
  local name = fixture_path:match("([^/]+)%.lua$") or fixture_path
  total = total + 1
  local ok, result = pcall(function()
    local fixture = dofile(fixture_path)
    local hs = run_check(health_dir .. "/" .. fixture.check .. ".lua", floats(fixture.obj))
    return { fixture = fixture, hs = hs }
  end)
  if not ok then
    failures = failures + 1
    print(string.format("FAIL %-40s error: %s", name, tostring(result)))
  else
    local want, got = result.fixture.expected, result.hs
    if type(got) ~= "table" or not valid[got.status] then
      failures = failures + 1
      print(string.format("FAIL %-40s returned no valid health status", name))
    elseif got.status ~= want.status or got.message ~= want.message then
      failures = failures + 1
      print(string.format("FAIL %-40s\n       want %s: %s\n       got  %s: %s", name,
        want.status, tostring(want.message), tostring(got.status), tostring(got.message)))
    else
      print(string.format("ok   %-40s %-11s %s", name, got.status, got.message))
    end
  end
end

print(string.format("%s: %d fixtures, %d failed", _VERSION, total, failures))
if failures > 0 or total == 0 then
  os.exit(1)
end
