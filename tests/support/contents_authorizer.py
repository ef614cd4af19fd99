"""A Jupyter Authorizer that denies one member the server's ``contents`` (the operator's word
on who may touch the files, e.g. a read-only deployment) and allows everything else."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.authorizer import Authorizer

#: The member who may not use the Jupyter server's files.
NO_CONTENTS = "carol"


class NoContentsForCarol(Authorizer):
    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return not (resource == "contents" and getattr(user, "username", None) == NO_CONTENTS)
