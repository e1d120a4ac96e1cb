"""The gateway's own CPU cost without an engine (``python -m tools.gateway_cost``)."""
