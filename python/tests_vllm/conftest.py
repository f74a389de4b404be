"""Fixtures of the vLLM suite: daemons as python/tests starts them (from
$RADIXD_BIN, each with a store and a name of its own), and vLLM engines
built on them, shut down when the test ends."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

# Collected only where vLLM is installed (scripts/test-vllm builds that).
pytest.importorskip("vllm")

_spec = importlib.util.spec_from_file_location(
    "radixd_tests_conftest", Path(__file__).resolve().parents[1] / "tests" / "conftest.py"
)
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
Daemon = _base.Daemon
# Daemons started by a test, stopped when it ends.
start_daemon = _base.start_daemon

import radixd  # noqa: E402

#: Reduced sizes for CI (RADIXD_VLLM_QUICK=1): fewer requests and rounds.
QUICK = bool(os.environ.get("RADIXD_VLLM_QUICK"))


def restart(d) -> None:
    """Starts ``d``'s daemon again, the same command line (after a SIGKILL):
    it adopts the store file."""
    d.proc = subprocess.Popen(d.proc.args, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            radixd.Client(d.name).close()
            return
        except radixd.RadixdError:
            if d.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon {d.name} did not come back")
            time.sleep(0.02)


@pytest.fixture
def store(start_daemon):
    """A daemon with a 64 MiB store (8 MiB extents)."""
    return start_daemon("--store", "64MiB", "--max-clients", "16")


@pytest.fixture
def engines():
    """Builds engines (`engines.make_engine`), shut down at the end."""
    from engines import make_engine

    made = []
    ids = []

    def make(*args, **kw):
        # Unique on the node: an engine id names its /dev/shm region.
        kw["engine_id"] = f"radixd-test-{os.getpid()}-{uuid.uuid4().hex[:6]}-{kw.get('engine_id', 'E')}"
        ids.append(kw["engine_id"])
        e = make_engine(*args, **kw)
        made.append(e)
        return e

    yield make
    for e in made:
        try:
            e.close()
        except Exception:  # noqa: BLE001 - teardown of a test that failed
            pass
    # Every engine's primary region is gone, those of engines whose tier
    # refused to start included: the tier lets go of the view before vLLM
    # releases it.
    left = [f"/dev/shm/vllm_offload_{i}.mmap" for i in ids if os.path.exists(f"/dev/shm/vllm_offload_{i}.mmap")]
    for path in left:
        os.unlink(path)
    assert not left, f"leaked primary regions: {left}"
