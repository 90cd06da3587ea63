# Shell helpers every gcloud step of cloudbuild.yaml sources (after the render step wrote .respawn-build/).
set -euo pipefail
BUILD_DIR=.respawn-build
if [ ! -f "$BUILD_DIR/names.env" ]; then
  echo "deploy: $BUILD_DIR/names.env is missing: the 'render' step must run first (python -m deploy.render)" >&2
  exit 1
fi
# shellcheck source=/dev/null
source "$BUILD_DIR/names.env"

fail() { echo "deploy: $*" >&2; exit 1; }

# IAM is eventually consistent: a service account or role created seconds ago may not be bindable yet.
retry() {
  local attempt
  for attempt in 1 2 3 4 5; do
    if "$@"; then return 0; fi
    echo "deploy: attempt $attempt of: $* failed; retrying" >&2
    sleep $((attempt * 5))
  done
  fail "gave up after 5 attempts: $*"
}

exists() { "$@" >/dev/null 2>&1; }
