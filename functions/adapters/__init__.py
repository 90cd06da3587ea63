"""Adapters: the only code that touches Google client libraries (Firestore, Compute Engine, Cloud TPU, Pub/Sub)
and the Slack webhook. Each is imported lazily by the core, so `import respawn.control.main` stays light."""
