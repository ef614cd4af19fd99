#!/bin/sh
# The image's entry point. `kaizen-entrypoint secrets DIR` makes the deployment's secrets
# once (compose's `secrets` service); any other command runs after the few variables whose
# programs cannot read a file themselves are read from VAR_FILE (the Docker secrets
# convention). Jupyter reads JUPYTER_TOKEN_FILE itself, asyncpg reads PGPASSFILE.
set -eu

if [ "${1:-}" = secrets ]; then
  dir=${2:?usage: kaizen-entrypoint secrets DIR}
  umask 022  # read by the postgres (uid 999) and kaizen (uid 1000) containers only
  # No trailing newline: Jupyter reads JUPYTER_TOKEN_FILE verbatim.
  for name in jupyter_token gateway_token postgres_password cookie_secret; do
    [ -s "$dir/$name" ] || python -c \
      "import secrets, sys; sys.stdout.write(secrets.token_urlsafe(32))" >"$dir/$name"
  done
  # host:port:database:user:password, for every Kaizen replica's asyncpg connections.
  printf '*:*:*:kaizen:%s\n' "$(cat "$dir/postgres_password")" >"$dir/pgpass"
  chmod 0600 "$dir/pgpass" && chown 1000:1000 "$dir/pgpass" 2>/dev/null || true
  echo "kaizen: open http://localhost:${KAIZEN_PORT:-8080}/lab?token=$(cat "$dir/jupyter_token")"
  exit 0
fi

for var in KG_AUTH_TOKEN JUPYTER_GATEWAY_AUTH_TOKEN KAIZEN_MODEL_API_KEY; do
  eval "file=\${${var}_FILE:-}"
  if [ -n "$file" ]; then
    value=$(cat "$file")
    export "$var=$value"
  fi
done
exec "$@"
