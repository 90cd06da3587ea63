#!/bin/bash
# bench/boot.py's baseline: deploy/vm/startup.sh as it was before the agent zipapp (git show 7a90d43^:deploy/vm/startup.sh),
# kept verbatim below this header so that the benchmark runs without the repository's history, but for its unit: the
# line @AGENT_UNIT@ is the node's unit (deploy/vm/startup.sh) with that day's ExecStart, filled in by bench/boot.py.
# It created a venv and ran `pip install respawn[agent,...]` at every fresh boot. Not used by any node.
#
# Respawn VM startup script (the instance's `startup-script` metadata; runs as root on every boot).
#
# Installs the Respawn node agent into a virtual environment at the version the control plane asks for
# (metadata attribute respawn-install: a pip requirement, e.g. "respawn[agent,torch]==0.1.0", or the deployed
# release "respawn[agent,storage] @ gs://BUCKET/respawn/releases/BUILD/respawn-0.1.0-py3-none-any.whl", which pip
# cannot fetch itself: the wheel is downloaded with the VM's service-account token from the Storage JSON API and
# installed from the local file), writes the systemd unit and starts it.
# Idempotent: on a restart in place the same install is skipped and a running agent is left alone (a restart
# would send it SIGTERM, which is a preemption notice).
#
# Overridable for tests: GCE_METADATA_HOST, RESPAWN_STORAGE_HOST, RESPAWN_ROOT, SYSTEMD_UNIT_DIR, SYSTEMCTL, PYTHON.
set -euo pipefail

METADATA="http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1"
ROOT="${RESPAWN_ROOT:-/opt/respawn}"
UNIT_DIR="${SYSTEMD_UNIT_DIR:-/etc/systemd/system}"
SYSTEMCTL="${SYSTEMCTL:-systemctl}"
PYTHON="${PYTHON:-python3}"
STORAGE="${RESPAWN_STORAGE_HOST:-https://storage.googleapis.com}"
UNIT=respawn-agent.service

say() { printf '{"severity": "%s", "message": "respawn startup: %s"}\n' "$1" "$2"; }

metadata() {
  curl -fsS --retry 10 --retry-delay 2 --retry-connrefused -H "Metadata-Flavor: Google" "$METADATA/$1"
}
attr() { metadata "instance/attributes/$1"; }

# "NAME @ gs://BUCKET/OBJECT" -> "NAME @ file:///local/wheel" (or the requirement unchanged when not gs://).
local_requirement() {
  local re='^(.*[^[:space:]])[[:space:]]*@[[:space:]]*gs://([^/[:space:]]+)/([^[:space:]]+)$'
  if ! [[ "$1" =~ $re ]]; then
    printf '%s' "$1"
    return
  fi
  local name="${BASH_REMATCH[1]}" bucket="${BASH_REMATCH[2]}" object="${BASH_REMATCH[3]}"
  local wheel="$ROOT/wheels/${object##*/}" token quoted
  mkdir -p "$ROOT/wheels"
  token="$(metadata instance/service-accounts/default/token \
    | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["access_token"])')" || {
    say ERROR "no access token from the metadata server; the VM needs a service account (the control plane attaches the node service account)" >&2
    return 1
  }
  quoted="$("$PYTHON" -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$object")"
  if ! curl -fsS --retry 5 --retry-delay 2 -H "Authorization: Bearer $token" -o "$wheel.part" \
      "$STORAGE/storage/v1/b/$bucket/o/$quoted?alt=media"; then
    rm -f "$wheel.part"
    say ERROR "could not download gs://$bucket/$object; check that the release exists (gcloud storage ls gs://$bucket/$object) and that the node service account may read the bucket (role respawnCheckpoints, deploy/iam/permissions.yaml)" >&2
    return 1
  fi
  mv -f "$wheel.part" "$wheel"
  printf '%s @ file://%s' "$name" "$wheel"
}

if ! INSTALL="$(attr respawn-install)" || [ -z "$INSTALL" ]; then
  say ERROR "metadata attribute respawn-install is missing; the control plane sets it (a pip requirement for respawn[agent,...])"
  exit 1
fi

VENV="$ROOT/venv"
MARKER="$ROOT/installed"
if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$INSTALL" ] && [ -x "$VENV/bin/python" ]; then
  say INFO "agent already installed ($INSTALL)"
  CHANGED=0
else
  say INFO "installing $INSTALL into $VENV"
  mkdir -p "$ROOT"
  if ! "$PYTHON" -m venv --system-site-packages "$VENV"; then
    # Debian/Ubuntu images without ensurepip need python3-venv.
    apt-get update -qq && apt-get install -y -qq python3-venv
    "$PYTHON" -m venv --system-site-packages "$VENV"
  fi
  # --system-site-packages: a Deep Learning VM image's CUDA-matched torch (or a TPU image's jax) is reused.
  REQUIREMENT="$(local_requirement "$INSTALL")"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$REQUIREMENT"
  printf '%s' "$INSTALL" > "$MARKER"
  CHANGED=1
fi

mkdir -p "$UNIT_DIR"
cat > "$UNIT_DIR/$UNIT.tmp" <<'UNIT_FILE'
@AGENT_UNIT@
UNIT_FILE
mv -f "$UNIT_DIR/$UNIT.tmp" "$UNIT_DIR/$UNIT"

$SYSTEMCTL daemon-reload
if [ "$CHANGED" = 1 ] && $SYSTEMCTL is-active --quiet "$UNIT"; then
  # A new version: SIGHUP makes the agent exit 75 without touching the trainer; Restart=on-failure brings up
  # the new agent, which adopts the running trainer.
  say INFO "new agent version: restarting the agent (the trainer keeps running)"
  $SYSTEMCTL kill --kill-who=main --signal=SIGHUP "$UNIT"
fi
# start, never restart: a running agent must not get a SIGTERM (that is a preemption notice).
$SYSTEMCTL enable --now "$UNIT"
say INFO "agent unit enabled and started"
