"""Tracking: MLflow naming, tags, parent and child runs, provenance, the offline fallback."""
