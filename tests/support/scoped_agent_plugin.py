"""An operator plugin (KAIZEN_PLUGINS) registering an agent with a knowledge scope, as a
third party would: plain data through ``kaizen_register_agents`` (R-002 tests).

Library ids are minted by the store, so the tests create the two collections with these ids
in the server's database before they use the agent: one is alice's, the other bob's private
collection, which the scope names but alice can never open.
"""

from __future__ import annotations

from kaizen_server_extension.tools import hookimpl
from kaizen_server_extension.tools.hookspecs import Registrar

SCOPED_AGENT = "librarian"
ALICES_SCOPED_COLLECTION = "alicescopednotes01"
BOBS_PRIVATE_COLLECTION = "bobsprivatenotes01"


@hookimpl
def kaizen_register_agents(register: Registrar) -> None:
    register({"agent_id": SCOPED_AGENT, "name": "Librarian", "mode": "search",
              "persona": "You answer from the member's notes.",
              "tool_ceiling": ["inspect_library", "read_artifact"],
              "knowledge_scope": {"collections": [ALICES_SCOPED_COLLECTION,
                                                  BOBS_PRIVATE_COLLECTION]}})
