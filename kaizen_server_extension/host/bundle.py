"""The authority bundle a run is admitted with, built in one place from its admission.

An admitted run and a resumed one get their bundle the same way: from the run row and the
:class:`~kaizen_server_extension.store.runs.Admission` written on it, so a resumed run
presents exactly the fields it was admitted with (R-006, R-007, R-054).
"""

from __future__ import annotations

import hashlib
import json

from kaizen_server_extension.protocol.authority import AuthorityBundle
from kaizen_server_extension.resources import NO_RESOURCES, AdmittedResources
from kaizen_server_extension.store.records import AgentRecord, ConversationRecord, RunRecord
from kaizen_server_extension.store.runs import Admission


def admitted_bundle(run: RunRecord, admission: Admission,
                    posture: str = "chat") -> AuthorityBundle:
    """The bundle of ``run`` under ``admission``: fixed for the life of the run. ``posture``
    is the run's task posture from its firing row (``store/tasks.py: posture_of``)."""
    return AuthorityBundle(
        run_id=run.id, conversation_id=run.conversation_id,
        input_position=run.input_position, member=run.member,
        agent_version_id=admission.agent_version_id,
        audience_version=admission.audience_version,
        resource_digest=admission.resource_digest, fence=run.fence, posture=posture,
    )


def recorded_admission(run: RunRecord) -> Admission | None:
    """The admission written on ``run``'s row, or None when it was never admitted."""
    if run.agent_version_id is None or run.audience_version is None \
            or run.resource_digest is None or run.catalog_digest is None:
        return None
    return Admission(agent_version_id=run.agent_version_id,
                     audience_version=run.audience_version,
                     resource_digest=run.resource_digest, catalog_digest=run.catalog_digest,
                     model=run.model)


def resource_digest(conversation: ConversationRecord, agent: AgentRecord,
                    catalog_digest: str, resources: AdmittedResources = NO_RESOURCES) -> str:
    """Digest of what the run is authorized over: room, roster, agent version (and its
    knowledge scope), catalog and the turn's attached files (ids, exact versions, content
    digests)."""
    payload = json.dumps({
        "conversation": conversation.id,
        "participants": sorted(conversation.participants),
        "agent_version": agent.version_id,
        "knowledge_scope": agent.knowledge_scope,
        "catalog": catalog_digest,
        "resources": resources.digest,
    }, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()
