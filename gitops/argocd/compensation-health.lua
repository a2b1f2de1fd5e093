-- Argo CD health of a backlog.dev/v1alpha1 Compensation (resource.customizations.health).
-- Waiting for its four-eyes approval is Suspended (it waits for people); a running worker is
-- Progressing; Succeeded and Duplicate (the id's first Compensation has the result) are
-- Healthy; Refused, PreconditionFailed, Unknown and Failed are Degraded: each waits for a
-- person (fix the template, re-evaluate, reconcile an unknown outcome downstream).
local hs = {}
local status = obj.status
if status == nil or status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to freeze the request"
  return hs
end
local phase = status.phase
if phase == "Succeeded" or phase == "Duplicate" then
  hs.status = "Healthy"
elseif phase == "AwaitingApproval" then
  hs.status = "Suspended"
elseif phase == "Executing" then
  hs.status = "Progressing"
else
  -- Refused, PreconditionFailed, Unknown, Failed
  hs.status = "Degraded"
end
hs.message = status.message or phase
return hs
