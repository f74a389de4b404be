"""Fixtures: a `radixd serve` daemon of its own per test (segment name unique
to the test run), started from the binary in $RADIXD_BIN or, by default,
target/debug/radixd (what `cargo build` and scripts/test build)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import radixd

ROOT = Path(__file__).resolve().parents[2]


def radixd_bin() -> str:
    path = os.environ.get("RADIXD_BIN") or str(ROOT / "target" / "debug" / "radixd")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no radixd binary at {path}: build it (cargo build) or set RADIXD_BIN")
    return path


class Daemon:
    """A `radixd serve` child, stopped when the test ends."""

    def __init__(self, *args: str, page_size: int = 4, capacity: int = 256):
        self.name = f"radixd-py-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.page_size = page_size
        self.capacity = capacity
        self.proc = subprocess.Popen(
            [radixd_bin(), "serve", "--name", self.name, "--page-size", str(page_size),
             "--capacity", str(capacity), *args],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                radixd.Client(self.name).close()
                return
            except radixd.RadixdError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"daemon {self.name} did not come up")
                time.sleep(0.01)

    def client(self, **kw) -> radixd.Client:
        return radixd.Client(self.name, **kw)

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # A daemon killed by a test cannot remove its segment: this one is
        # ours (a name of this run) and its daemon is gone, so remove it.
        # The store file (`--store`) outlives its daemon by design: same.
        for path in (f"/dev/shm/{self.name}", f"/dev/shm/{self.name}.store"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def files_of_this_run() -> list[str]:
    """The files in /dev/shm of the daemons this pytest process started."""
    mine = (f"radixd-py-{os.getpid()}-", f".radixd-py-{os.getpid()}-")
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith(mine))


@pytest.fixture(autouse=True)
def leaves_nothing_in_shm():
    """Tests leave nothing in /dev/shm: once a test and its fixtures are
    done (autouse, so torn down after the daemons), no file of this run's
    daemons may remain; one that does is removed and fails the test."""
    yield
    left = files_of_this_run()
    for f in left:
        try:
            os.unlink(os.path.join("/dev/shm", f))
        except FileNotFoundError:
            pass
    if left:
        pytest.fail(f"the test left {left} in /dev/shm (removed now)")


@pytest.fixture
def daemon():
    d = Daemon("--max-clients", "8")
    yield d
    d.stop()


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
