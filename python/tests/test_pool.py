"""One daemon, one KV pool: ``radixd.Client(name, pool=...)`` binds the
daemon's pool to a KV buffer; a client of another buffer is refused with
``radixd.PoolMismatchError`` saying what to do; unbound clients read beside
the binding; the binding goes with its last holder (closed or killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import radixd

GPU0 = {"device": "cuda:0", "uuid": "GPU-aaaa", "page_size": 4, "pages": 256, "dtype": "bfloat16"}
GPU1 = dict(GPU0, device="cuda:1", uuid="GPU-bbbb")
CANON0 = "device=cuda:0;dtype=bfloat16;page_size=4;pages=256;uuid=GPU-aaaa"


def wait_for(client: radixd.Client, want) -> None:
    deadline = time.monotonic() + 2
    while client.pool_binding() != want:
        assert time.monotonic() < deadline, (client.pool_binding(), want)
        time.sleep(0.005)


def test_the_first_binder_binds_and_another_buffer_is_refused(daemon):
    with daemon.client(pool=GPU0) as a, daemon.client(pool=";".join(reversed(CANON0.split(";")))) as b:
        assert a.pool == b.pool == CANON0
        assert a.pool_binding() == (CANON0, 2)
        with pytest.raises(radixd.PoolMismatchError) as refused:
            daemon.client(pool=GPU1)
        e = refused.value
        assert e.kind == "pool_mismatch"
        for needle in ("radixd serve --name OTHER", "RADIXD_NAME=OTHER", "radixd serve --store",
                       "uuid (bound GPU-aaaa, this client GPU-bbbb)"):
            assert needle in e.message, e.message

        # A client that binds nothing reads beside the binding, but does not
        # fill the pool (test_pool_scope.py).
        with daemon.client() as guest:
            assert guest.pool is None
            pages = a.alloc(2)
            a.insert(list(range(8)), pages)
            assert guest.match_prefix(list(range(8))).len == 8
            with pytest.raises(radixd.NotPermittedError, match="bind"):
                guest.alloc(2)

            # Bad identities: a typed error before anything is sent, and the
            # binding as it was.
            for bad in ("garbage", "", "a=1;;b=2", "Key=1", {"a": ""}, {"a": "x;y"}, "k=" + "v" * 1024):
                with pytest.raises(radixd.MalformedError):
                    daemon.client(pool=bad)
            with pytest.raises(TypeError):
                daemon.client(pool=42)
            with pytest.raises(TypeError):
                daemon.client(pool={1: "x"})
            assert guest.pool_binding() == (CANON0, 2)

            a.close()
            wait_for(guest, (CANON0, 1))
            b.close()
            wait_for(guest, None)
            # The cached prefixes went with the buffer their KV lived in.
            assert guest.match_prefix(list(range(8))).len == 0
            with daemon.client(pool=GPU1) as c:
                assert guest.pool_binding() == (c.pool, 1)


def test_a_killed_binder_releases_the_pool(daemon):
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time, radixd\n"
         f"c = radixd.Client({daemon.name!r}, pool={GPU0!r})\n"
         "print('bound', flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "bound"
        with daemon.client() as watcher:
            assert watcher.pool_binding() == (CANON0, 1)
            with pytest.raises(radixd.PoolMismatchError):
                daemon.client(pool=GPU1)
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            wait_for(watcher, None)
            with daemon.client(pool=GPU1) as restarted:
                assert watcher.pool_binding() == (restarted.pool, 1)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
