"""The OTLP/HTTP exporter's transport to a plain ``http://`` endpoint
(app/tracing/transport.py): posts go over one kept connection, a connection the receiver
closes (said or not) is opened again, and a refused one is a connection error the SDK's
exporter tries again."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from opentelemetry.sdk.resources import Resource

from app.tracing import export, otlp
from app.tracing.records import SERVER, FinishedTrace, SpanRecord
from app.tracing.setup import SCOPE
from app.tracing.transport import PlainHttpTransport
from tests.support.traces import QuietHandler, serving

ENVELOPE = otlp.envelope(Resource.create({"service.name": "gw-test"}), SCOPE.name, "1")


@dataclass
class Receiving:
    bodies: list[bytes] = field(default_factory=list)
    connections: set[tuple[str, int]] = field(default_factory=set)
    headers: list[dict[str, str]] = field(default_factory=list)


@contextmanager
def receiver(*, keep: bool = True, drop_silently: bool = False) -> Iterator[tuple[str, Receiving]]:
    """A receiver that keeps its connections (``keep``), or closes each after its answer,
    saying so or (``drop_silently``) not."""
    received = Receiving()

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1" if keep or drop_silently else "HTTP/1.0"

        def do_POST(self) -> None:
            received.bodies.append(self.rfile.read(int(self.headers["content-length"])))
            received.connections.add(self.client_address)
            received.headers.append(dict(self.headers.items()))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            if drop_silently:
                self.close_connection = True

    with serving(Handler) as port:
        yield f"http://127.0.0.1:{port}/v1/traces", received


def test_posts_go_over_one_kept_connection() -> None:
    transport = PlainHttpTransport()
    with receiver() as (url, received):
        for n in range(3):
            result = transport.request(
                "POST", url, headers={"Content-Type": "application/x-protobuf"}, data=bytes([n])
            )
            assert (result.status_code, result.error, result.content()) == (200, None, b"ok")
            assert result.headers()["CONTENT-TYPE"] == "application/x-protobuf"
        transport.close()
    assert received.bodies == [b"\x00", b"\x01", b"\x02"]
    assert len(received.connections) == 1
    assert received.headers[0]["Content-Type"] == "application/x-protobuf"


def test_a_receiver_that_closes_each_connection_gets_every_post() -> None:
    transport = PlainHttpTransport()
    with receiver(keep=False) as (url, received):
        for n in range(3):
            assert transport.request("POST", url, data=bytes([n]), timeout=5).status_code == 200
        transport.close()
    assert received.bodies == [b"\x00", b"\x01", b"\x02"]
    assert len(received.connections) == 3


def test_the_exporter_posts_again_where_the_kept_connection_was_dropped() -> None:
    root = SpanRecord("chat m", 1, 0, 1_000, SERVER, {"lora_gateway.tenant.id": "t"})
    request = ENVELOPE(otlp.spans(FinishedTrace.of(7, None, None, [root])))
    with receiver(drop_silently=True) as (url, received):
        sender = export.sender(grpc=False, endpoint=url)
        assert sender is not None
        try:
            assert sender.send(request, 1)
            assert sender.send(request, 1)  # the first connection is gone: a second one
        finally:
            sender.shutdown()
    assert received.bodies == [request, request]


def test_a_refused_connection_is_a_connection_error() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    transport = PlainHttpTransport()
    result = transport.request("POST", f"http://127.0.0.1:{port}/v1/traces", data=b"x", timeout=5)
    assert result.status_code is None
    assert transport.is_connection_error(result.error)
