"""Shared fixtures."""

import importlib.util

import pytest


@pytest.fixture
def no_triton(monkeypatch):
    """Make Triton look uninstalled (a CPU-only torch wheel) to ``importlib.util.find_spec``."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
