"""Administration: the service behind /admin/v1 and `lora-gateway tenants apply`."""
