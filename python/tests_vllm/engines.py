"""Real vLLM 0.33.0 schedulers on the CPU with ``TieringOffloadingSpec`` and
:class:`radixd.vllm.RadixdTier` as the issue configures them, and a fake
worker that does what vLLM's GPU worker would: writes each stored block's
KV (known bytes derived from its block hash) into the engine's primary
rows, reads each loaded chunk back out of them, and acks the jobs through
``OffloadingWorkerMetadata`` as vLLM's own connector tests fake them.

Only the GPU side is fake (vLLM's ``CPUOffloadingWorker`` needs CUDA):
the scheduler, the connector, the tiering manager, its primary tier over a
real ``SharedOffloadRegion`` and the tier are vLLM's and radixd's own.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BLOCK = 16  # tokens per GPU block (and per hash)
LAYERS = 2
KV_HEADS = 2
HEAD_DIM = 16
GPU_BLOCKS = 128

_model_dirs: dict = {}
_owner = os.getpid()


@atexit.register
def _remove_model_dirs() -> None:
    # Only the process that made them: a forked engine process exiting
    # must not take them from the tests still running.
    if os.getpid() == _owner:
        for d in _model_dirs.values():
            shutil.rmtree(d, ignore_errors=True)


def model_dir(
    name: str = "llama-tiny",
    layers: int = LAYERS,
    dtype: str = "float16",
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
) -> str:
    """A local model directory holding a small Llama ``config.json`` (no hub)."""
    key = (name, layers, dtype, kv_heads, head_dim)
    if key not in _model_dirs:
        d = Path(tempfile.mkdtemp(prefix=f"radixd-vllm-{name}-"))
        (d / "config.json").write_text(
            json.dumps(
                {
                    "architectures": ["LlamaForCausalLM"],
                    "model_type": "llama",
                    "hidden_size": kv_heads * head_dim * 2,
                    "intermediate_size": 128,
                    "num_attention_heads": kv_heads * 2,
                    "num_key_value_heads": kv_heads,
                    "head_dim": head_dim,
                    "num_hidden_layers": layers,
                    "vocab_size": 1000,
                    "max_position_embeddings": 4096,
                    "torch_dtype": dtype,
                    "rms_norm_eps": 1e-5,
                }
            )
        )
        _model_dirs[key] = str(d)
    return _model_dirs[key]


def tier_config(store: str | None, cpu_bytes: int, **extra) -> dict:
    """The ``kv_connector_extra_config`` of the issue."""
    tier = {"type": "RadixdTier", "module_path": "radixd.vllm"}
    if store is not None:
        tier["store"] = store
    cfg = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": cpu_bytes,
        "secondary_tiers": [tier],
    }
    cfg.update(extra)
    return cfg


def block_bytes(block_hash: bytes, n: int) -> np.ndarray:
    """The KV bytes a stored GPU block holds in these tests: a function of
    its block hash (so every engine computes the same bytes for the same
    prefix), ``n`` bytes long."""
    seed = int.from_bytes(hashlib.sha256(block_hash).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@dataclass
class Engine:
    """One vLLM engine: a real ``Scheduler`` with the offloading connector,
    stepped by a fake worker."""

    scheduler: object
    engine_id: str
    model: str
    # Primary rows written or read, for the byte checks.
    loads_checked: int = 0
    loads_wrong: list = field(default_factory=list)
    stores_done: int = 0
    finished: set = field(default_factory=set)
    hasher: object = None

    @property
    def manager(self):
        return self.scheduler.connector.connector_scheduler.manager

    @property
    def tier(self):
        return self.manager.secondary_tiers[0]

    @property
    def rows(self) -> np.ndarray:
        return np.asarray(self.manager.primary_tier.get_kv_memoryview()).view(np.uint8)

    def request(self, req_id: str, tokens: list, max_tokens: int = 1):
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=max_tokens)
        return Request(req_id, list(tokens), params, None, block_hasher=self.hasher)

    def add(self, req_id: str, tokens: list, max_tokens: int = 1):
        req = self.request(req_id, tokens, max_tokens)
        self.scheduler.add_request(req)
        return req

    def step(self):
        """One scheduler step and the fake worker's answer to it."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        done = {}
        recving = set()
        if meta is not None:
            for job_id, job in meta.store_jobs.items():
                self._store(job)
                done[job_id] = 1
            for job_id, job in meta.load_jobs.items():
                self._load(job)
                done[job_id] = 1
                recving.add(job.req_id)
        req_ids = list(out.num_scheduled_tokens.keys())
        # A request that finished its prompt gets one token.
        sampled = []
        for rid in req_ids:
            req = self.scheduler.requests[rid]
            # (`schedule()` already counted this step's tokens as computed.)
            sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
        mro = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(
                finished_recving=recving or None,
                kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done),
            ),
        )
        outputs = self.scheduler.update_from_output(out, mro)
        for eco in outputs.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self.finished.add(o.request_id)
        return out

    def _hashes_of(self, req_id: str) -> list:
        return list(self.scheduler.requests[req_id].block_hashes)

    def _store(self, job) -> None:
        """GPU blocks -> primary chunks: each chunk's row gets its blocks'
        known bytes (one block per chunk here: ``blocks_per_chunk`` 1)."""
        rows = self.rows
        chunks = list(job.dst_spec.chunk_ids)
        req = self.scheduler.requests.get(job.req_id)
        hashes = list(req.block_hashes) if req is not None else []
        # The chunk of block index i: the GPU spec's block_indices give the
        # first block index of the job's run.
        first = int(job.src_spec.block_indices[0]) if getattr(job.src_spec, "block_indices", None) is not None else 0
        for j, c in enumerate(chunks):
            idx = first + j
            if idx < len(hashes):
                rows[c][:] = block_bytes(bytes(hashes[idx]), rows.shape[1])
        self.stores_done += 1

    def _load(self, job) -> None:
        """Primary chunks -> GPU blocks: check each promoted row holds the
        bytes of the block it stands for."""
        rows = self.rows
        chunks = list(job.src_spec.chunk_ids)
        req = self.scheduler.requests.get(job.req_id)
        hashes = list(req.block_hashes) if req is not None else []
        first = int(job.dst_spec.block_indices[0]) if getattr(job.dst_spec, "block_indices", None) is not None else 0
        for j, c in enumerate(chunks):
            idx = first + j
            self.loads_checked += 1
            if idx >= len(hashes) or not np.array_equal(rows[c], block_bytes(bytes(hashes[idx]), rows.shape[1])):
                self.loads_wrong.append((job.req_id, idx, int(c)))

    def run(self, req_ids, timeout: float = 60.0) -> None:
        """Steps until every request of ``req_ids`` finished and no job is in
        flight (the tier's jobs run on its own thread: steps then wait a
        little for them)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.step()
            if set(req_ids) <= self.finished:
                if not self.manager.has_pending_work():
                    return
                time.sleep(0.001)
        limit = f"{timeout} s"
        tier = self.tier
        raise AssertionError(
            f"{self.engine_id}: {set(req_ids) - self.finished} unfinished after {limit} steps "
            f"(jobs {sorted(self.manager._jobs)}, tier pending {getattr(tier, '_pending', '?')}, "
            f"results {len(getattr(tier, '_done', ()))}, cascades "
            f"{[s.pending_cascade_keys for s in self.manager._req_state.values() if s.pending_cascade_keys]})"
        )

    def close(self) -> None:
        self.scheduler.shutdown()


def make_engine(
    store: str | None,
    *,
    engine_id: str | None = None,
    model: str | None = None,
    cpu_bytes: int = 64 * 4096 * LAYERS,
    hash_algo: str = "sha256_cbor",
    dtype: str = "float16",
    layers: int = LAYERS,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
    extra: dict | None = None,
    kv_events: bool = False,
) -> Engine:
    """A real vLLM ``Scheduler`` (async scheduling off, so each step is
    answered before the next) with the issue's tier configuration."""
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVEventsConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    engine_id = engine_id or f"engine-{uuid.uuid4().hex[:8]}"
    path = model or model_dir(layers=layers, dtype=dtype, kv_heads=kv_heads, head_dim=head_dim)
    model_config = ModelConfig(
        model=path, tokenizer=path, skip_tokenizer_init=True, dtype=dtype, seed=0, max_model_len=4096
    )
    cache_config = CacheConfig(
        block_size=BLOCK, enable_prefix_caching=True, prefix_caching_hash_algo=hash_algo
    )
    cfg = tier_config(store, cpu_bytes, **(extra or {}))
    vc = VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        scheduler_config=SchedulerConfig(
            max_num_seqs=16, max_num_batched_tokens=4096, max_model_len=4096, is_encoder_decoder=False
        ),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config=cfg, engine_id=engine_id
        ),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null") if kv_events else None,
    )
    vc.scheduler_config.async_scheduling = False
    vc.cache_config.num_gpu_blocks = GPU_BLOCKS
    torch_dtype = getattr(torch, dtype)
    layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    kv_cache_config = KVCacheConfig(
        num_blocks=GPU_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                layer_names,
                FullAttentionSpec(block_size=BLOCK, num_kv_heads=kv_heads, head_size=head_dim, dtype=torch_dtype),
            )
        ],
    )
    hash_fn = get_hash_fn_by_name(hash_algo)
    init_none_hash(hash_fn)
    sched = Scheduler(vc, kv_cache_config, StructuredOutputManager(vc), block_size=BLOCK)
    return Engine(sched, engine_id, path, hasher=get_request_block_hasher(BLOCK, hash_fn))


def prompt(seed: int, n_tokens: int) -> list:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(1, 999, n_tokens)]


if os.environ.get("RADIXD_VLLM_DEBUG"):
    import logging

    logging.basicConfig(level=logging.DEBUG)
