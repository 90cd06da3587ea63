"""The VM startup script put in every node's `startup-script` metadata: install the node agent and run it as a
systemd service. deploy/ may ship its own script (deploy/startup-script.sh), which then wins.

The agent package comes from the `respawn-agent-package` metadata attribute or RESPAWN_AGENT_PACKAGE in the
controller's environment (a pip requirement, or a gs:// path to a wheel); default `respawn`.
"""

from __future__ import annotations

import os
from pathlib import Path

DEPLOY_SCRIPT = Path(__file__).resolve().parent.parent / "deploy" / "startup-script.sh"

_SCRIPT = r"""#!/bin/bash
# Respawn node bootstrap: install the node agent and start it under systemd (restarted if it dies).
set -euo pipefail
MD=http://metadata.google.internal/computeMetadata/v1/instance/attributes
attr() { curl -sf -H 'Metadata-Flavor: Google' "$MD/$1" || true; }
PKG="$(attr respawn-agent-package)"
PKG="${PKG:-__PACKAGE__}"
mkdir -p /opt/respawn /var/lib/respawn
if [ ! -x /opt/respawn/venv/bin/python ]; then
  python3 -m venv /opt/respawn/venv
fi
if [[ "$PKG" == gs://* ]]; then
  WHEEL="/opt/respawn/$(basename "$PKG")"
  gcloud storage cp "$PKG" "$WHEEL"
  PKG="$WHEEL"
fi
/opt/respawn/venv/bin/pip install --quiet --upgrade "$PKG"
cat > /etc/systemd/system/respawn-agent.service <<'UNIT'
[Unit]
Description=Respawn node agent (heartbeats, preemption notice, trainer supervision)
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/opt/respawn/venv/bin/python -m node_agent
Restart=on-failure
RestartSec=5
# The agent needs the 30 s preemption notice to checkpoint: stop it last and give it the whole window.
TimeoutStopSec=30
KillMode=mixed

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now respawn-agent.service
"""


def startup_script() -> str:
    if DEPLOY_SCRIPT.exists():
        return DEPLOY_SCRIPT.read_text()
    return _SCRIPT.replace("__PACKAGE__", os.environ.get("RESPAWN_AGENT_PACKAGE", "respawn"))
