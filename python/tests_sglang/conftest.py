"""Fixtures of the SGLang suite: SGLang's runtime config published once, the
radixd plugin loaded through SGLang's own plugin loader (the entry point
`pip install ./python` registered), and daemons as python/tests starts them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# Collected only where SGLang is installed (scripts/test-sglang builds that).
pytest.importorskip("sglang")
pytest.importorskip("torch")

_spec = importlib.util.spec_from_file_location(
    "radixd_tests_conftest", Path(__file__).resolve().parents[1] / "tests" / "conftest.py"
)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
Daemon = _base.Daemon
# Tests leave nothing in /dev/shm (checked after each test).
leaves_nothing_in_shm = _base.leaves_nothing_in_shm


@pytest.fixture(scope="session", autouse=True)
def sglang_runtime():
    from sglang.srt.plugins import load_plugins

    from sim import publish_runtime

    publish_runtime()
    load_plugins()


@pytest.fixture
def start_daemon():
    started = []

    def start(*args: str, **kw) -> Daemon:
        d = Daemon(*args, **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
