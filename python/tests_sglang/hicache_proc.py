"""One SGLang process for test_hicache: builds radixd's HiCache backend
through SGLang's factory against the daemon in argv, over SGLang's own host
pool, does one job and prints its figures as one JSON line.

    python hicache_proc.py '{"name": ..., "kind": "mha", "layout": "page_first", "jobs": [...]}'

Jobs (each a dict with "job" and its arguments; the answer is one dict per job):
- ``read``: reads the chain ``tag`` of ``n`` keys; counts the run
  ``batch_exists`` found, the pages ``batch_get_v1`` copied and those whose
  bytes are not the key's (``bad``: must be 0).
- ``write``: stores the chain ``tag`` of ``n`` keys.
- ``churn``: ``rounds`` times stores a fresh chain of ``n`` keys and reads
  back a random earlier one of its own or of ``other`` (the other process's
  tag), checking every page it got by content.
"""

from __future__ import annotations

import json
import random
import sys

from hicache_pools import (
    backend,
    chain_keys,
    content,
    get_chain,
    make_pool,
    page_size_bytes,
    set_chain,
    storage_config,
)


def check(got, keys, nbytes):
    found = sum(g is not None for g in got)
    bad = sum(g is not None and g != content(k, nbytes) for g, k in zip(got, keys))
    return found, bad


def main(args: dict) -> list:
    pool = make_pool(args["kind"], args["layout"], **args.get("pool", {}))
    b = backend(storage_config(args["name"], mla=args["kind"] == "mla"), pool)
    nbytes = page_size_bytes(pool)
    return [run(b, pool, nbytes, job) for job in args["jobs"]]


def run(b, pool, nbytes: int, args: dict) -> dict:
    job = args["job"]
    if job == "write":
        keys = chain_keys(args["tag"], args["n"])
        return {"stored": sum(set_chain(b, pool, keys))}
    if job == "read":
        keys = chain_keys(args["tag"], args["n"])
        length, got = get_chain(b, pool, keys)
        found, bad = check(got, keys, nbytes)
        return {"run": length, "found": found, "bad": bad}
    if job == "churn":
        rng = random.Random(args["seed"])
        hits = misses = bad = 0
        for r in range(args["rounds"]):
            keys = chain_keys(f"{args['tag']}-{r}", args["n"])
            set_chain(b, pool, keys)
            tag = rng.choice([args["tag"], args["other"]])
            back = chain_keys(f"{tag}-{rng.randrange(r + 1)}", args["n"])
            _, got = get_chain(b, pool, back)
            found, wrong = check(got, back, nbytes)
            hits += found
            misses += len(back) - found
            bad += wrong
        return {"hits": hits, "misses": misses, "bad": bad, "stats": b.store_stats()}
    raise ValueError(f"unknown job {job!r}")


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
