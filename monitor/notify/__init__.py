"""Notify: the webhook outbox, payload formats, Standard Webhooks signatures and the delivery worker.

Receivers come from ``[[webhooks]]`` tables in ``draftwatch.toml`` or ``DRAFTWATCH_WEBHOOKS`` (a JSON
list); see ``docs/alerts.md`` for the formats and how to verify signatures.
"""
