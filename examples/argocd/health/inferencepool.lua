-- Argo CD health check for InferencePool (tidegate.dev/v1alpha1).
--
-- Healthy      Ready=True and status.observedGeneration is current.
-- Progressing  no status yet, status.observedGeneration behind metadata.generation, the pool
--              is scaling (Scaling=True; an Advisory recommendation is not scaling), or its
--              replicas are not ready yet.
-- Degraded     CapacityExhausted=True (at max replicas or the GPU budget and still over the
--              SLO: new tenants are being paused), MetricsAvailable=False (the operator holds
--              its last decision), the referenced TierPolicy is missing or unreadable, or
--              the operator cannot read the pool's spec (Ready=False InvalidSpec), or
--              the pool's oci:// model cannot be mounted here (ModelVolumeUnsupported), or
--              its s3:// or hf:// model cannot be fetched (ModelFetchFailed: a missing
--              object, refused credentials; the kubelet keeps retrying meanwhile).
-- The message is the deciding condition's message.
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

local exhausted = condition(status, "CapacityExhausted")
if exhausted ~= nil and exhausted.status == "True" then
  hs.status = "Degraded"
  hs.message = text(exhausted, "At its ceiling and over its SLO; new tenants are paused")
  return hs
end

local metrics = condition(status, "MetricsAvailable")
if metrics ~= nil and metrics.status == "False" then
  hs.status = "Degraded"
  hs.message = text(metrics, "No fresh metrics (" .. tostring(metrics.reason) .. "); holding the last scaling decision")
  return hs
end

-- Ready=False reasons that no waiting fixes: someone has to change a manifest.
local needs_a_fix = {
  TierPolicyNotFound = "The referenced TierPolicy does not exist",
  TierPolicyInvalid = "The referenced TierPolicy cannot be read by the operator",
  InvalidSpec = "The operator cannot read this pool's spec",
  ModelVolumeUnsupported = "This cluster cannot mount the pool's model image",
  ModelFetchFailed = "The pool's model cannot be fetched",
}
local ready = condition(status, "Ready")
if ready ~= nil and ready.status == "False" and needs_a_fix[ready.reason] ~= nil then
  hs.status = "Degraded"
  hs.message = text(ready, needs_a_fix[ready.reason])
  return hs
end

local readyReplicas = status.readyReplicas or 0
local desiredReplicas = status.desiredReplicas or 0

local scaling = condition(status, "Scaling")
if scaling ~= nil and scaling.status == "True" and scaling.reason ~= "Advisory" then
  hs.status = "Progressing"
  hs.message = text(scaling, string.format("Scaling to %d replicas", desiredReplicas))
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = text(ready, string.format("%d/%d replicas ready", readyReplicas, desiredReplicas))
  return hs
end

-- A pool with replicas.min 0 that scaled to zero is idle, not broken.
if ready ~= nil and ready.status == "False" and ready.reason == "NoReplicas" and desiredReplicas == 0 then
  hs.status = "Healthy"
  hs.message = text(ready, "Scaled to zero")
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = text(ready, string.format("%d/%d replicas ready", readyReplicas, desiredReplicas))
else
  hs.message = "Waiting for the Ready condition"
end
return hs
