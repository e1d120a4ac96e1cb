"""Helpers shared by the test suites (adapter factory, reference decoding)."""
