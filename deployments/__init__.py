"""The Ray Serve application: ``serve run deployments:app`` (or ``deployments:build_app key=value ...``)."""

from deployments.app import build_app

app = build_app()

__all__ = ["app", "build_app"]
