#!/bin/bash
# Respawn VM startup script (the instance's `startup-script` metadata; runs as root on every boot).
#
# Installs nothing but the node agent: one zipapp, named with its sha256 by the metadata attribute respawn-agent
# (URI#sha256=HEX; gs://BUCKET/OBJECT on Google Cloud, file:///PATH on the local stand-ins). A gs:// object is
# downloaded through the Storage JSON API with the VM's service-account token, the digest is checked, and the
# file is installed atomically as $ROOT/respawn-agent.pyz. The agent runs on the image's own python3 (3.9 and up;
# $ROOT/python links to it), so there is no venv and no pip at boot. Then it writes the systemd unit and starts it.
# Idempotent: a later boot that finds the same digest downloads nothing, and a running agent is left alone (a
# restart would send it SIGTERM, which is a preemption notice). Every line it prints is one JSON object.
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
ATTR_AGENT=respawn-agent  # respawn.contract.ATTR_AGENT
AGENT="$ROOT/respawn-agent.pyz"
LINK="$ROOT/python"
MIN_PYTHON=3.9

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
STARTED="$(now)"

json_string() {
  local s="$1"
  s="${s//\\/\\\\}"; s="${s//\"/\\\"}"; s="${s//$'\n'/\\n}"; s="${s//$'\r'/\\r}"; s="${s//$'\t'/\\t}"
  printf '"%s"' "$s"
}
# say SEVERITY MESSAGE [KEY=TEXT | KEY:=JSON]...: one JSON line on stdout (the serial console, the journal).
say() {
  local line
  line="{\"severity\": \"$1\", \"message\": $(json_string "respawn startup: $2")"
  shift 2
  local field key
  for field in "$@"; do
    key="${field%%=*}"
    if [[ "$key" == *: ]]; then
      line+=", $(json_string "${key%:}"): ${field#*=}"
    else
      line+=", $(json_string "$key"): $(json_string "${field#*=}")"
    fi
  done
  printf '%s}\n' "$line"
}
die() { say ERROR "$@"; exit 1; }

# The tools this script runs. All but curl are in every Debian/Ubuntu base (coreutils, sed, mawk); curl is not
# (a debootstrap minbase image lacks it), and without this check its absence read as "metadata server not
# reachable; check the VM's network".
MISSING=()
for tool in curl awk sed tr cut sha256sum stat mktemp readlink date; do
  command -v "$tool" >/dev/null 2>&1 || MISSING+=("$tool")
done
if (( ${#MISSING[@]} )); then
  die "the node image lacks ${MISSING[*]}, which this script needs; use an image that has them (Debian/Ubuntu packages curl, coreutils, sed, mawk), e.g. a Deep Learning VM image" \
    "missing=${MISSING[*]}"
fi

ERRORS="$(mktemp)"
trap 'rm -f "$ERRORS" "$AGENT.part"' EXIT

# curl's own messages go to $ERRORS, so that they end up inside a JSON line instead of beside them.
metadata() {
  curl -fsS --retry 10 --retry-delay 2 --retry-connrefused -H "Metadata-Flavor: Google" "$METADATA/$1" 2>"$ERRORS"
}

# ---- the interpreter: the image's own python3 ------------------------------------------------------------------

if ! PY_INFO="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2]); print(sys.executable)' 2>"$ERRORS")"; then
  die "cannot run the Python interpreter '$PYTHON'; the agent runs on the node image's own python3 ($MIN_PYTHON or newer): use an image that has it on PATH, or set PYTHON" \
    "error=$(cat "$ERRORS")"
fi
PY_VERSION="$(sed -n 1p <<<"$PY_INFO")"
PY_EXE="$(sed -n 2p <<<"$PY_INFO")"
if ! [[ "$PY_VERSION" =~ ^([0-9]+)\.([0-9]+)$ ]] \
    || (( BASH_REMATCH[1] < 3 || (BASH_REMATCH[1] == 3 && BASH_REMATCH[2] < 9) )); then
  die "$PY_EXE is Python $PY_VERSION; the agent needs $MIN_PYTHON or newer: use a newer node image (Debian 11 Deep Learning VM or later), or set PYTHON to a newer interpreter" \
    "python=$PY_EXE" "version=$PY_VERSION"
fi
if [[ "$PY_EXE" != /* ]]; then
  die "'$PYTHON' does not report an absolute sys.executable ('$PY_EXE'), which the unit needs; set PYTHON to the interpreter's path"
fi

# ---- the agent: respawn-agent = URI#sha256=HEX ----------------------------------------------------------------

if VALUE="$(metadata "instance/attributes/$ATTR_AGENT")"; then
  :
elif [ "$?" = 22 ]; then  # curl -f: the server answered, with an HTTP error (404: no such attribute)
  die "metadata attribute $ATTR_AGENT is missing; the control plane sets it from RESPAWN_AGENT (URI#sha256=HEX of the agent zipapp, deploy/render.py): redeploy with cloudbuild.yaml, then let the controller recreate the node" \
    "attribute=$ATTR_AGENT" "error=$(cat "$ERRORS")"
else
  die "metadata server $METADATA not reachable; check the VM's network (or GCE_METADATA_HOST in local runs)" \
    "attribute=$ATTR_AGENT" "error=$(cat "$ERRORS")"
fi
VALUE="$(tr -d '[:space:]' <<<"$VALUE")"
if ! [[ "$VALUE" =~ ^((gs://|file:///)[^#]+)#sha256=([0-9a-f]{64})$ ]]; then
  die "metadata attribute $ATTR_AGENT is '$VALUE', expected gs://BUCKET/OBJECT#sha256=<64 lowercase hex> (or file:///PATH#sha256=…): it comes from RESPAWN_AGENT in the functions' environment; redeploy with cloudbuild.yaml" \
    "attribute=$ATTR_AGENT"
fi
URI="${BASH_REMATCH[1]}"
WANT="${BASH_REMATCH[3]}"

digest() { sha256sum "$1" | cut -d' ' -f1; }

# Into $AGENT.part; the caller checks the digest before it becomes $AGENT.
download() {
  local uri="$1" re='^gs://([^/]+)/(.+)$' token quoted
  if [[ "$uri" == file:///* ]]; then
    if ! cp -f "${uri#file://}" "$AGENT.part" 2>"$ERRORS"; then
      die "could not copy $uri; check that the file exists" "uri=$uri" "error=$(cat "$ERRORS")"
    fi
    return
  fi
  [[ "$uri" =~ $re ]] || die "$uri names no object (gs://BUCKET/OBJECT); check RESPAWN_AGENT" "uri=$uri"
  local bucket="${BASH_REMATCH[1]}" object="${BASH_REMATCH[2]}"
  if ! token="$(metadata instance/service-accounts/default/token \
      | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["access_token"])' 2>>"$ERRORS")"; then
    die "no access token from the metadata server; the VM needs a service account (the control plane attaches the node service account)" \
      "error=$(cat "$ERRORS")"
  fi
  quoted="$("$PYTHON" -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$object")"
  # The header comes in on stdin (-H @-, curl 7.55 and up; Debian 11 has 7.74), from printf, a builtin: the token is
  # never in an argv, which any local user can read in /proc/PID/cmdline.
  if ! printf 'Authorization: Bearer %s\n' "$token" | curl -fsS --retry 5 --retry-delay 2 -H @- -o "$AGENT.part" \
      "$STORAGE/storage/v1/b/$bucket/o/$quoted?alt=media" 2>"$ERRORS"; then
    die "could not download $uri; check that the release exists (gcloud storage ls $uri) and that the node service account may read the bucket (role respawnCheckpoints, deploy/iam/permissions.yaml)" \
      "uri=$uri" "error=$(cat "$ERRORS")"
  fi
}

mkdir -p "$ROOT"
FETCH_STARTED="$(now)"
CHANGED=0
if [ -f "$AGENT" ] && [ "$(digest "$AGENT")" = "$WANT" ]; then
  say INFO "agent already present ($URI)" stage=agent_fetch "seconds:=$(since "$FETCH_STARTED")" \
    downloaded:=false uri="$URI" sha256="$WANT"
else
  download "$URI"
  GOT="$(digest "$AGENT.part")"
  if [ "$GOT" != "$WANT" ]; then
    die "$URI has sha256 $GOT, but $ATTR_AGENT promises $WANT; the release was changed or corrupted after the deployment: redeploy with cloudbuild.yaml" \
      uri="$URI" expected="$WANT" actual="$GOT"
  fi
  chmod 0644 "$AGENT.part"
  mv -f "$AGENT.part" "$AGENT"  # a rename: a reader sees the old file or the new one, never half of one
  say INFO "agent fetched and verified ($URI)" stage=agent_fetch "seconds:=$(since "$FETCH_STARTED")" \
    downloaded:=true uri="$URI" sha256="$WANT" "bytes:=$(stat -c %s "$AGENT")"
  CHANGED=1
fi

# The unit runs $LINK, so it never names a version-specific path; a link that changes is an upgrade too.
if [ "$(readlink "$LINK" 2>/dev/null || true)" != "$PY_EXE" ]; then
  ln -sfn "$PY_EXE" "$LINK.tmp"
  mv -Tf "$LINK.tmp" "$LINK"
  CHANGED=1
fi
say INFO "agent interpreter: $LINK -> $PY_EXE (Python $PY_VERSION)" python="$PY_EXE" version="$PY_VERSION"

# ---- the unit ------------------------------------------------------------------------------------------------

mkdir -p "$UNIT_DIR"
cat > "$UNIT_DIR/$UNIT.tmp" <<'UNIT_FILE'
# Respawn node agent. Written and started by deploy/vm/startup.sh, the one place it is defined.
[Unit]
Description=Respawn node agent: heartbeat, preemption notice, emergency checkpoint, trainer supervision
Documentation=https://github.com/respawn-ml/respawn/blob/main/node_agent/README.md
# Stopped before the network goes down at shutdown, so the final heartbeat can still reach Firestore.
Wants=network-online.target
After=network-online.target
StartLimitIntervalSec=0

[Service]
Type=simple
Environment=RESPAWN_NODE_DIR=/var/lib/respawn
Environment=PYTHONUNBUFFERED=1
EnvironmentFile=-/etc/respawn/agent.env
StateDirectory=respawn
WorkingDirectory=/var/lib/respawn
# The image's own python3 (a link the startup script points at it) and the verified agent zipapp.
ExecStart=/opt/respawn/python /opt/respawn/respawn-agent.pyz
# SIGTERM (shutdown, preemption) is a notice: the agent tells the trainer, waits for its emergency checkpoint
# and writes the final heartbeat. Only the agent gets the signal: the trainer is told by the agent, and when
# the agent crashes or is restarted the trainer keeps running and the next agent adopts it.
KillMode=process
KillSignal=SIGTERM
# Must exceed notice_budget_seconds (default 25) + 3 s for the final heartbeat; the hardware cut-off comes
# first anyway (30 s after the soft-off for Spot VMs, 120 s for standard VMs).
TimeoutStopSec=150
Restart=on-failure
RestartSec=2
# 2: missing or invalid respawn-* metadata attributes; restarting cannot fix that.
RestartPreventExitStatus=2
# The trainer takes the memory; if something must go under memory pressure, it is not the agent.
OOMScoreAdjust=-900
StandardOutput=journal
StandardError=journal

[Install]
WantedBy=multi-user.target
UNIT_FILE
mv -f "$UNIT_DIR/$UNIT.tmp" "$UNIT_DIR/$UNIT"

$SYSTEMCTL daemon-reload
if [ "$CHANGED" = 1 ] && $SYSTEMCTL is-active --quiet "$UNIT"; then
  # A new agent: SIGHUP makes the running one exit 75 without touching the trainer; Restart=on-failure brings up
  # the new agent, which adopts the running trainer.
  say INFO "new agent: handing over to it (SIGHUP; the trainer keeps running)"
  $SYSTEMCTL kill --kill-who=main --signal=SIGHUP "$UNIT"
fi
say INFO "starting the agent unit" stage=total "seconds:=$(since "$STARTED")"
# Now, not at exit: on a sim node the script runs until its power-off kills it, which runs no trap.
rm -f "$ERRORS"
# start, never restart: a running agent must not get a SIGTERM (that is a preemption notice).
$SYSTEMCTL enable --now "$UNIT"
say INFO "agent unit enabled and started"
