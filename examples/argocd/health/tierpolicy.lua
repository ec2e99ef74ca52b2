-- Argo CD health check for TierPolicy (tidegate.dev/v1alpha1).
--
-- Healthy      Ready=True and status.observedGeneration is current.
-- Progressing  no status yet, or status.observedGeneration behind metadata.generation, or no
--              Ready verdict yet.
-- Degraded     Ready=False (the operator refused the policy, e.g. its API-key Secret is
--              missing), carrying the condition's message.
--
-- Written for Argo CD's Lua 5.1 (gopher-lua) and runs unchanged on Lua 5.4.
local hs = {}

local function condition(status, ctype)
  if status == nil or status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

-- The condition's message; without one, the fallback.
local function text(c, fallback)
  if c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the tidegate operator to report status"
  return hs
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
local observed = status.observedGeneration
if observed == nil or (generation ~= nil and observed < generation) then
  hs.status = "Progressing"
  if generation ~= nil then
    hs.message = string.format("Waiting for the tidegate operator to observe generation %d", generation)
  else
    hs.message = "Waiting for the tidegate operator to observe the latest spec"
  end
  return hs
end

local ready = condition(status, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = text(ready, string.format("%d tiers, used by %d pools", status.tierCount or 0, status.pools or 0))
  return hs
end
if ready ~= nil and ready.status == "False" then
  hs.status = "Degraded"
  hs.message = text(ready, "The tier policy was not accepted")
  return hs
end

hs.status = "Progressing"
hs.message = "Waiting for the Ready condition"
return hs
