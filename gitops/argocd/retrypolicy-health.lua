-- Argo CD health of a backlog.dev/v1alpha1 RetryPolicy (resource.customizations.health).
-- Healthy when Ready; Degraded when the policy is invalid or a budget that uses it has a
-- deadline shorter than the policy's worst-case retry delay.
local hs = {}
local status = obj.status
local ready, conflict = nil, nil
if status ~= nil and status.conditions ~= nil then
  for _, c in ipairs(status.conditions) do
    if c.type == "Ready" then ready = c end
    if c.type == "DeadlineConflict" then conflict = c end
  end
end
if ready == nil or (status.observedGeneration ~= nil and obj.metadata.generation ~= nil
    and status.observedGeneration < obj.metadata.generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to evaluate the policy"
elseif ready.status ~= "True" then
  hs.status = "Degraded"
  hs.message = ready.message
elseif conflict ~= nil and conflict.status == "True" then
  hs.status = "Degraded"
  hs.message = conflict.message
else
  hs.status = "Healthy"
  hs.message = ready.message
end
return hs
