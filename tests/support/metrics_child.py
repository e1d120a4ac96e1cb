"""The worker's side of tests/test_metrics_export.py, in a module of its own: a spawned
process imports the module its target is defined in, and this one imports only the recorder
(the test module imports the gateway, and with it vLLM: seconds of start-up)."""

from __future__ import annotations

from multiprocessing.synchronize import Event

from app.inside_vllm.prometheus_recorder import PrometheusRecorder


def record_in_child(done: Event, scraped: Event) -> None:
    """The worker's side: one of each event; exits once scraped."""
    recorder = PrometheusRecorder()
    recorder._reporting = True  # skip importing vLLM to ask for the rank
    recorder.start()
    recorder.use("storage", "legal", "3", 1)
    recorder.use("device", "legal", "3", 2)
    recorder.swap("load", 0.2, "legal", "3")
    recorder.swap("activate", 0.003, "legal", "3")
    recorder.placed("legal", "3", "device")
    recorder.eviction("host", 1)
    recorder.resident("device", 1)
    recorder.resident("host", 2)
    done.set()
    scraped.wait(timeout=120)
