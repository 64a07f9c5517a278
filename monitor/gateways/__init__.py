"""Gateways: the verdict acting inside the gateway a serving team already runs, draftwatch out of its data path.

Each module speaks one gateway's language: the Gateway API's ``HTTPRoute`` rendered from today's
routing decisions and the active rollout's share (and applied through the Kubernetes API), and a
LiteLLM proxy integration that reports each response's speculative figures through the record
contract, routes a workload draftwatch sent to plain to the plain deployment and a rollout's share
to the candidate deployment. The proxy (``monitor/proxy``) stays the path with no gateway at all.
"""
