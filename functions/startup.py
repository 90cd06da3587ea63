"""The VM startup script put in every node's `startup-script` metadata: deploy/vm/startup.sh (owned by deploy/ and
node_agent/; respawn.deployment reads it, deploy/stage.py ships it with the function source). It installs the
agent named by the `respawn-install` attribute (nodespec.py, from RESPAWN_INSTALL) and starts it under systemd."""

from __future__ import annotations

from respawn import deployment


def startup_script() -> str:
    return deployment.startup_script()
