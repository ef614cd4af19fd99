"""JupyterHub for a team on Kaizen: Hub users are Kaizen members, every user's own Jupyter
server runs the Kaizen extension, and all of them share one PostgreSQL store (docs/deploy.md,
"JupyterHub"). tests/distribution/test_jupyterhub.py runs a Hub with exactly this file.

    KAIZEN_DATABASE_URL=postgresql+asyncpg://kaizen@db.internal:5432/kaizen \
        jupyterhub -f docs/examples/jupyterhub_config.py
"""

import os

c = get_config()  # type: ignore[name-defined]  # noqa: F821 (provided by JupyterHub)

# Who may log in is the site's choice: OAuthenticator, LDAPAuthenticator, PAM... The dummy
# authenticator admits any name with any password: for trying this out, never in production.
c.JupyterHub.authenticator_class = os.environ.get("KAIZEN_HUB_AUTHENTICATOR", "dummy")

# One Jupyter server per user. The simple spawner runs every server as the Hub's own OS user
# in a directory per user: a trial on one machine. In production use LocalProcessSpawner (a
# system user each), DockerSpawner or KubeSpawner; nothing below changes.
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = os.environ.get(
    "KAIZEN_HUB_HOMES", "/tmp/kaizen-hub") + "/{username}"
c.Spawner.default_url = "/lab"

# Inside a Hub-spawned server the Hub's identity provider names the caller: the member *is*
# the Hub user (Kaizen's own token provider stands down there). Admins are Hub names too.
# Every server uses the same store, so a shared room, its queue and its approvals are the same
# whichever user's server a participant uses.
c.Spawner.environment = {
    "KAIZEN_DATABASE_URL": os.environ["KAIZEN_DATABASE_URL"],
    "KAIZEN_DATABASE_SCHEMA": os.environ.get("KAIZEN_DATABASE_SCHEMA", ""),
    "KAIZEN_ADMIN_MEMBERS": os.environ.get("KAIZEN_ADMIN_MEMBERS", ""),
    "KAIZEN_MODEL_BASE_URL": os.environ.get("KAIZEN_MODEL_BASE_URL", ""),
    "KAIZEN_MODEL": os.environ.get("KAIZEN_MODEL", ""),
    "KAIZEN_LOG_FORMAT": os.environ.get("KAIZEN_LOG_FORMAT", "text"),
}
