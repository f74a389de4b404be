"""End to end: a page inserted into `radixd serve --kv-events` until `radixd index
serve` answers a query that sees it (RADIXD_BIN, default target/release/radixd;
run from the repository root with the package installed)."""
import os
import subprocess
import time

import radixd
B = os.environ.get("RADIXD_BIN", "target/release/radixd")
name = f"lat-{os.getpid()}"
pub, rep = f"ipc:///tmp/{name}.pub", f"ipc:///tmp/{name}.rep"
d = subprocess.Popen([B, "serve", "--name", name, "--page-size", "16", "--capacity", "65536", "--kv-events", pub, "--kv-events-replay", rep], stderr=subprocess.DEVNULL)
time.sleep(0.5)
q = f"ipc:///tmp/{name}.q"
ix = subprocess.Popen([B, "index", "serve", "--listen", q, "--subscribe", f"w={pub}@{rep}", "--block-size", "16"], stderr=subprocess.DEVNULL)
time.sleep(0.5)
c = radixd.Client(name)
cl = radixd.IndexClient(q, timeout=2.0)
lat = []
for i in range(300):
    toks = [i * 100000 + j for j in range(64)]
    pages = c.alloc(4)
    t0 = time.perf_counter()
    c.insert(toks, pages)
    while True:
        a = cl.query(tokens=toks)
        if a["scores"].get("w") == 4:
            break
    lat.append((time.perf_counter() - t0) * 1e3)
    time.sleep(0.01 if i % 2 else 0.2)
lat.sort()
print(f"event visible after insert: p50 {lat[len(lat)//2]:.2f} ms, p99 {lat[int(len(lat)*0.99)]:.2f} ms, max {lat[-1]:.2f} ms ({len(lat)} samples)")
ix.terminate(); d.terminate(); ix.wait(); d.wait()
