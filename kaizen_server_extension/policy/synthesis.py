"""The synthesis-grant instructions, authored once here and applied to every agent
(spec: Budgets and the synthesis grant)."""

from __future__ import annotations

from kaizen_server_extension.runtime.port import SynthesisInstructions

SYNTHESIS = SynthesisInstructions(
    with_evidence=(
        "You have no tool rounds left. Answer the member now, using only the evidence the "
        "tools already returned in this conversation. Do not call any tool. Say plainly if "
        "the evidence is incomplete."
    ),
    without_evidence=(
        "Answer the member now without calling any tool. None of the tools available to "
        "you could do what was asked: say plainly what cannot be done and which capability "
        "is missing. Do not suggest trying again."
    ),
    without_evidence_after_failure=(
        "Answer the member now without calling any tool. A tool call failed or timed out, "
        "so you gathered no evidence: say so plainly, say what could not be done, and say "
        "that trying again may work."
    ),
)
