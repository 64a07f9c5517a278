"""The sidecar API: ingest from any serving stack, serve the embedded decoder, expose metrics."""

from monitor.api.app import create_app, openapi_document

__all__ = ["create_app", "openapi_document"]
