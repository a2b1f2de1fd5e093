-- Argo CD health of a backlog.dev/v1alpha1 BacklogBudget (resource.customizations.health).
-- Healthy while the operator enforces the budget and the deadline holds; Degraded when the
-- deadline is breached or cannot be met, when metrics are missing (nothing is scaled then),
-- and when the budget is invalid or another autoscaler owns the target.
local hs = {}
local function condition(status, kind)
  if status.conditions == nil then return nil end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then return c end
  end
  return nil
end
local status = obj.status
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to evaluate the budget"
  return hs
end
if status.observedGeneration ~= nil and obj.metadata.generation ~= nil
    and status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to evaluate the latest spec"
  return hs
end
local phase = status.phase
local detail = status.explanation or ""
if phase == "Healthy" then
  hs.status = "Healthy"
  hs.message = detail
elseif phase == "AtRisk" then
  -- Within the deadline, past the warning fraction: still healthy, say why.
  hs.status = "Healthy"
  hs.message = "At risk: " .. detail
elseif phase == "MetricsUnavailable" then
  local c = condition(status, "MetricsAvailable")
  hs.status = "Degraded"
  hs.message = (c and c.message) or "Metrics unavailable; replicas are held"
elseif phase == "Conflict" then
  local c = condition(status, "Conflict")
  hs.status = "Degraded"
  hs.message = (c and c.message) or "Another autoscaler owns the target"
else
  -- Breaching, Undrainable, Invalid
  hs.status = "Degraded"
  hs.message = phase .. ": " .. detail
end
return hs
