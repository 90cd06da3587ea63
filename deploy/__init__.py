"""What cloudbuild.yaml applies. `python -m deploy.render` writes the build's generated inputs (see render.py)."""
