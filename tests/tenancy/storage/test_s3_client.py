"""S3 clients: each configured from the environment as it is when made, all reading one copy
of botocore's parsed service data."""

from __future__ import annotations

import pytest

from app.tenancy.storage.s3 import s3_client


def test_each_client_reads_the_environment_of_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9001")
    first = s3_client()
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9002")
    second = s3_client()

    assert first.meta.endpoint_url == "http://127.0.0.1:9001"
    assert second.meta.endpoint_url == "http://127.0.0.1:9002"
    assert first.meta.service_model.service_name == "s3"
    # The service model parsed once, for both.
    assert first.meta.service_model._service_description is (
        second.meta.service_model._service_description
    )
