"""Adapters: the only code that touches Google client libraries (Firestore, Compute Engine, Cloud TPU, Pub/Sub)
and the Slack webhook. Each is imported lazily by the core, so `import functions.main` stays light."""
