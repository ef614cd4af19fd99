"""The backend's guardrail chain: authority, permissions, ceilings, approvals, redaction.

Every decision here runs on the trusted callback path, never inside the model or the turn
controller (spec: guardrails, Where they sit). Modules are imported directly
(``from kaizen_server_extension.policy.approvals import ...``); this package re-exports nothing
so that importing one guardrail never drags in the rest.
"""
