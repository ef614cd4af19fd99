"""Sandbox limits: per-execution budgets and the per-process resource limits of a kernel.

Two kinds of limit live here:

* per-execution budgets (wall time, output bytes): the server passes ``SANDBOX_MAX_WALL_SECONDS``
  (default 30 s, R-077) and ``SANDBOX_MAX_OUTPUT_BYTES`` (default 1 MiB, R-078), validated by
  its settings model (``kaizen_server_extension/settings.py``);
* per-process ``setrlimit`` limits (address space, processes, file size, open files, core
  dumps) applied to the kernel process before it execs, by a tiny wrapper command.

The wrapper is a separate ``python -I -S -c`` process that sets the limits and ``execv``s the
real command, rather than a ``preexec_fn``: the server is multi-threaded, where ``preexec_fn``
is documented as unsafe.
"""

from __future__ import annotations

import json
import resource
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

DEFAULT_WALL_SECONDS = 30.0
DEFAULT_OUTPUT_BYTES = 1024 * 1024
MAX_WALL_SECONDS = 240.0  # the shared per-tool ceiling bounds any configuration

@dataclass(frozen=True, slots=True)
class ExecutionBudget:
    """What one run_code call may use (the server's settings bound both)."""

    wall_seconds: float = DEFAULT_WALL_SECONDS
    output_bytes: int = DEFAULT_OUTPUT_BYTES

    def clamp(self, wall_seconds: float | None, output_bytes: int | None) -> ExecutionBudget:
        """A call may ask for less than the configured budget, never more."""
        wall = self.wall_seconds if wall_seconds is None or wall_seconds <= 0 \
            else min(wall_seconds, self.wall_seconds)
        out = self.output_bytes if output_bytes is None or output_bytes <= 0 \
            else min(output_bytes, self.output_bytes)
        return ExecutionBudget(wall_seconds=wall, output_bytes=out)


@dataclass(frozen=True, slots=True)
class ProcessLimits:
    """``setrlimit`` values for a kernel process (soft = hard). ``0`` leaves a limit alone."""

    address_space_bytes: int = 4 * 1024**3
    max_processes: int = 4096  # RLIMIT_NPROC counts the user's threads too; ipykernel has several
    max_file_bytes: int = 512 * 1024**2
    max_open_files: int = 1024
    core_bytes: int = 0
    cpu_seconds: int = 0  # 0: wall time is the bound; a persistent kernel lives across calls

    def as_rlimits(self) -> dict[str, int]:
        """``{RLIMIT_NAME: value}`` for every limit that is set (core is always set)."""
        pairs = {
            "RLIMIT_AS": self.address_space_bytes,
            "RLIMIT_NPROC": self.max_processes,
            "RLIMIT_FSIZE": self.max_file_bytes,
            "RLIMIT_NOFILE": self.max_open_files,
            "RLIMIT_CPU": self.cpu_seconds,
        }
        out = {name: value for name, value in pairs.items()
               if value > 0 and hasattr(resource, name)}
        out["RLIMIT_CORE"] = max(self.core_bytes, 0)
        return out

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> ProcessLimits:
        values = {name: int(str(data[name])) for name in cls.__dataclass_fields__
                  if name in data}
        return cls(**values)


# Runs in a fresh ``python -I -S``: stdlib only, no site, no user environment. It may lower a
# limit but never raise one above the server's own hard limit.
_WRAPPER_SOURCE = """\
import json, os, resource, sys
limits = json.loads(sys.argv[1])
for name, value in limits.items():
    which = getattr(resource, name, None)
    if which is None:
        continue
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY and value > hard:
        value = hard
    resource.setrlimit(which, (value, value))
argv = sys.argv[2:]
os.execvpe(argv[0], argv, os.environ)
"""


def rlimit_wrapper_argv(limits: ProcessLimits, cmd: Sequence[str],
                        python: str | None = None) -> list[str]:
    """``cmd`` prefixed by the wrapper that applies ``limits`` and then execs ``cmd``."""
    interpreter = python or sys.executable
    return [interpreter, "-I", "-S", "-c", _WRAPPER_SOURCE,
            json.dumps(limits.as_rlimits(), sort_keys=True), *cmd]
