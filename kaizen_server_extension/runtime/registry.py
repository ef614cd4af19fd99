"""The static registry of turn controllers (spec: Runtime pipelines, R-003).

Each admitted run uses exactly one controller from this registry. The lane records the
chosen name in the run's ``run.admitted`` event, and a recovery continues the run with the
controller recorded there: the choice is fixed for the run, including reconnect and
recovery. The registry is a constant, not a plugin point: no request, agent or plugin can
add a controller or pick one that is not listed here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from kaizen_server_extension.runtime.controller import TurnController
from kaizen_server_extension.runtime.port import HostPort, ResumePoint, RunManifest

ControllerFactory = Callable[..., TurnController]

#: The turn engine: ordered model steps, guarded tool rounds, one synthesis grant.
TURN_ENGINE = "turn_engine"

CONTROLLERS: Mapping[str, ControllerFactory] = MappingProxyType({TURN_ENGINE: TurnController})
DEFAULT_CONTROLLER = TURN_ENGINE


def controller_for(name: object, port: HostPort, manifest: RunManifest, *,
                   resume: ResumePoint | None = None) -> TurnController | None:
    """The registered controller ``name`` over ``port`` (None when no such controller is
    registered: a run is never moved to another one)."""
    factory = CONTROLLERS.get(name) if isinstance(name, str) else None
    if factory is None:
        return None
    return factory(port, manifest, resume=resume)
