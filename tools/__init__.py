"""Operator tooling that runs beside the gateway (not part of the product in ``app/``)."""
