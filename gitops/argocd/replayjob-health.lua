-- Argo CD health of a backlog.dev/v1alpha1 ReplayJob (resource.customizations.health).
-- A replay waiting for its four-eyes approval, for an earlier replay of the same queue, or
-- suspended is Suspended (it waits for people, nothing is wrong); running stages are
-- Progressing; Succeeded is Healthy; Failed, Halted and Refused (a spec to fix before the start)
-- are Degraded.
local hs = {}
local status = obj.status
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to freeze the scope"
  return hs
end
local phase = status.phase
local message = status.message or phase
if phase == "Succeeded" then
  hs.status = "Healthy"
elseif phase == "Failed" or phase == "Halted" or phase == "Refused" then
  hs.status = "Degraded"
elseif phase == "AwaitingApproval" or phase == "Suspended" or phase == "Approved" then
  hs.status = "Suspended"
elseif phase == "Pending" then
  -- The scope cannot be frozen yet (e.g. the eventIdsFrom ConfigMap is missing).
  hs.status = "Progressing"
else
  -- Canary, Verifying, Running
  hs.status = "Progressing"
end
hs.message = message
return hs
