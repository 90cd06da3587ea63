"""The self-test's acknowledgements (respawn.selftest): the function at the end of a probed link writes its field of
the probe's document, in the self-test's own database."""

from __future__ import annotations

import time

from respawn import selftest


def ack(clients, doc: str, link: selftest.Link, detail: str = "") -> None:
    """Mark `link` answered in probes/{doc} (a probe, or selftest.TICKS). A failure raises: the platform redelivers."""
    db = clients.firestore_database(selftest.DATABASE)
    db.collection(selftest.COLLECTION).document(doc).set({link.key: {"at": time.time(), "detail": detail}}, merge=True)
