"""A CPU stand-in for vLLM's GPU offloading worker, for the worker-role test.

vLLM 0.33.0's ``CPUOffloadingWorker`` copies with CUDA streams, so
``TieringOffloadingSpec.get_worker`` refuses a CPU platform. This spec is
``TieringOffloadingSpec`` with only that changed: its worker copies, at
submit time, between the canonical KV tensors ``register_kv_caches`` built
(CPU tensors here) and the engine's real primary region (the same
``SharedOffloadRegion`` file the scheduler side maps and the tier reads),
laid out as vLLM's does it: a row is this worker's pages of every canonical
tensor, one after the other. Loaded by vLLM's own factory through
``spec_module_path``."""

from __future__ import annotations

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec


class CpuOffloadingWorker(OffloadingWorker):
    def __init__(self, kv_caches: CanonicalKVCaches, region: SharedOffloadRegion, blocks_per_chunk: int):
        self.region = region
        self.tensors = [t.tensor for t in kv_caches.tensors]
        self.views = [region.create_next_worker_view(t.page_size_bytes) for t in kv_caches.tensors]
        self.blocks_per_chunk = blocks_per_chunk
        self.done: list = []

    def _pairs(self, gpu_spec, cpu_spec):
        assert self.blocks_per_chunk == 1, "the test runs one block a chunk"
        return zip((int(b) for b in gpu_spec.block_ids), (int(c) for c in cpu_spec.chunk_ids))

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        for block, chunk in self._pairs(src_spec, dst_spec):
            for view, tensor in zip(self.views, self.tensors):
                view[chunk].copy_(tensor[block].view(-1))
        self.done.append(TransferResult(job_id, True))
        return True

    def submit_load(self, job_id, src_spec, dst_spec, expedited: bool = False) -> bool:
        for block, chunk in self._pairs(dst_spec, src_spec):
            for view, tensor in zip(self.views, self.tensors):
                tensor[block].view(-1).copy_(view[chunk])
        self.done.append(TransferResult(job_id, True))
        return True

    def get_finished(self) -> list:
        done, self.done = self.done, []
        return done

    def wait(self, job_ids) -> None:
        return

    def shutdown(self) -> None:
        self.views = []
        self.tensors = []
        self.region.cleanup()


class CpuTieringOffloadingSpec(TieringOffloadingSpec):
    """``TieringOffloadingSpec`` whose worker is :class:`CpuOffloadingWorker`."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if not self._worker:
            region = SharedOffloadRegion(
                engine_id=self.config.engine_id,
                num_chunks=self.num_chunks,
                rank=0,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            self._worker = CpuOffloadingWorker(kv_caches, region, self.blocks_per_chunk)
        return self._worker
