"""The package-tool runner's child process. Runs as a script (``python -I path``), so it imports
nothing from Kaizen and the trusted package is not on its path.

Protocol: one JSON request on stdin ``{"package_dir", "entry": "module:function",
"arguments"}``; one JSON reply on stdout ``{"ok": true, "result": ...}`` or
``{"ok": false, "error_type": ..., "error": ...}``. While the package runs, its prints go to
stderr so they cannot forge the reply.
"""

import asyncio
import contextlib
import importlib
import inspect
import json
import sys


def main() -> int:
    reply_to = sys.stdout
    try:
        request = json.loads(sys.stdin.read())
        module_name, _, function_name = str(request["entry"]).partition(":")
        sys.path.insert(0, str(request["package_dir"]))
        with contextlib.redirect_stdout(sys.stderr):
            function = getattr(importlib.import_module(module_name), function_name)
            result = function(**dict(request.get("arguments") or {}))
            if inspect.isawaitable(result):
                result = asyncio.run(_wait(result))
        reply = {"ok": True, "result": result}
        text = json.dumps(reply, allow_nan=False)
    except BaseException as exc:  # the whole point is to report, never to crash silently
        text = json.dumps(
            {"ok": False, "error_type": type(exc).__name__, "error": str(exc)[:2000]}
        )
    reply_to.write(text)
    reply_to.flush()
    return 0


async def _wait(awaitable):  # type: ignore[no-untyped-def]
    return await awaitable


if __name__ == "__main__":
    sys.exit(main())
