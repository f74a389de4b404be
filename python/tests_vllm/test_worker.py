"""The whole path through vLLM's own connector on both sides: a WORKER-role
``OffloadingConnector`` over CPU KV tensors (``register_kv_caches``,
``start_load_kv``, ``save_kv_layer``, ``wait_for_save``, ``get_finished``,
``build_connector_worker_meta``, as vLLM's model runner calls them), its
transfers done by a CPU stand-in for the CUDA worker (``cpu_worker.py``).
Engine A's model writes known KV into its GPU blocks; they travel to A's
primary rows, into the radixd store, into engine B's primary rows and into
B's GPU blocks, where they must be the same bytes."""

from __future__ import annotations

import hashlib
import time

import numpy as np
import torch
from engines import BLOCK, HEAD_DIM, KV_HEADS, LAYERS, prompt

SPEC = {"spec_name": "CpuTieringOffloadingSpec", "spec_module_path": "cpu_worker"}


def kv_of(block_hash: bytes, layer: int, n: int) -> torch.Tensor:
    seed = int.from_bytes(hashlib.sha256(block_hash + bytes([layer])).digest()[:8], "little")
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8))


class Worker:
    """One engine's worker: its KV tensors and a WORKER-role connector."""

    def __init__(self, engine):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

        self.engine = engine
        sched = engine.scheduler
        self.connector = OffloadingConnector(sched.vllm_config, KVConnectorRole.WORKER, sched.kv_cache_config)
        nb = sched.kv_cache_config.num_blocks
        self.layers = {
            f"model.layers.{i}.self_attn.attn": torch.zeros(nb, 2, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.float16)
            for i in range(LAYERS)
        }
        self.connector.register_kv_caches(self.layers)
        self.written: set = set()
        # Loaded GPU block -> its block index in the request.
        self.loaded: dict = {}

    def block_ids(self, req_id: str) -> list:
        return list(self.engine.scheduler.kv_cache_manager.get_block_ids(req_id)[0])

    def step(self) -> None:
        """A scheduler step and the worker's side of it, as vLLM's model
        runner runs the connector around a forward pass."""
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        sched = self.engine.scheduler
        out = sched.schedule()
        meta = out.kv_connector_metadata
        c = self.connector
        c.handle_preemptions(meta)
        c.bind_connector_metadata(meta)
        c.start_load_kv(None)
        for job in meta.load_jobs.values():
            first = int(job.dst_spec.block_indices[0]) if job.dst_spec.block_indices is not None else 0
            for j, blk in enumerate(job.dst_spec.block_ids):
                self.loaded[int(blk)] = first + j
        # The forward pass: KV of every block this step completes.
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            ids = self.block_ids(rid)
            # `schedule()` already counted this step's tokens as computed.
            first, end = (req.num_computed_tokens - n) // BLOCK, req.num_computed_tokens // BLOCK
            for idx in range(first, min(end, len(req.block_hashes))):
                b = ids[idx]
                for li, t in enumerate(self.layers.values()):
                    t[b].view(torch.uint8).view(-1).copy_(kv_of(bytes(req.block_hashes[idx]), li, t[b].nbytes))
                self.written.add(b)
        for name, t in self.layers.items():
            c.save_kv_layer(name, t, None)
        c.wait_for_save()
        sending, recving = c.get_finished(out.finished_req_ids)
        worker_meta = c.build_connector_worker_meta()
        c.clear_connector_metadata()
        req_ids = list(out.num_scheduled_tokens)
        sampled = [
            [7] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else []
            for r in req_ids
        ]
        mro = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(
                finished_sending=sending or None, finished_recving=recving or None, kv_connector_worker_meta=worker_meta
            ),
        )
        for eco in sched.update_from_output(out, mro).values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self.engine.finished.add(o.request_id)

    def run(self, req_id: str, steps: int = 400) -> None:
        for _ in range(steps):
            self.step()
            if req_id in self.engine.finished and not self.engine.manager.has_pending_work():
                return
            time.sleep(0.001)
        raise AssertionError(f"{req_id} did not finish")

    def close(self) -> None:
        self.connector.shutdown()


def test_save_kv_layer_to_a_load_in_another_engine(store, engines):
    a = engines(store.name, engine_id="WA", extra=SPEC)
    b = engines(store.name, engine_id="WB", extra=SPEC)
    wa, wb = Worker(a), Worker(b)
    try:
        p = prompt(77, 6 * BLOCK + 5)
        a.add("a", p)
        wa.run("a")
        # A's stores are deferred to its next step's start_kv_transfers,
        # then cascade to the store on the tier's copy thread: step until
        # they land (a loaded machine may run that thread late), not for a
        # fixed count of steps.
        deadline = time.monotonic() + 60
        with store.client() as c:
            while c.store_stats()["values"] < 6 and time.monotonic() < deadline:
                wa.step()
                time.sleep(0.001)
            assert c.store_stats()["values"] == 6
        b.add("b", p)
        wb.run("b")
        assert sorted(wb.loaded.values()) == list(range(6))
        assert not (set(wb.loaded) & wb.written), "B computed a block it loaded"
        hashes = [bytes(h) for h in b.request("probe", p).block_hashes]
        # Each block B loaded holds A's KV of the same tokens, every layer.
        for blk, idx in wb.loaded.items():
            for li, t in enumerate(wb.layers.values()):
                got = t[blk].view(torch.uint8).view(-1)
                assert torch.equal(got, kv_of(hashes[idx], li, t[blk].nbytes)), (idx, li)
    finally:
        wa.close()
        wb.close()
