#!/usr/bin/env python3
"""serve_load.py - `vllm bench --workload throughput`'s load through `vllm
serve`: N requests of random token-id prompts, at most C in flight (a bounded
loopback client, as vLLM's `benchmark_serving.py --max-concurrency`), each
streaming its completion of a fixed length (ignore_eos, greedy).

Usage: bench/serve_load.py VLLM MODEL_DIR N C INPUT_LEN OUTPUT_LEN [EXTRA_SERVE_ARGS...]
Prints output tok/s, total tok/s and requests/s over the whole run, TTFT and
TPOT p50 / p99, the same figures `vllm bench --workload throughput` prints
for the engine alone. Python's standard library only.
"""
import http.client
import json
import random
import sys
import threading
import time

from serve_proc import start_server

vllm, model = sys.argv[1], sys.argv[2]
N, C, IN, OUT = (int(a) for a in sys.argv[3:7])
extra = sys.argv[7:]

proc, port = start_server(vllm, model, ["--max-num-seqs", str(C), *extra], echo=True)

conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
conn.request("GET", "/v1/models")
model_id = json.loads(conn.getresponse().read())["data"][0]["id"]
rng = random.Random(0)
prompts = [[rng.randrange(3, 1000) for _ in range(IN)] for _ in range(N)]


def one(i, res):
    body = {"model": model_id, "prompt": prompts[i], "max_tokens": OUT, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.time()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    first, tokens = None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        elif first is None and ev.get("choices"):
            first = time.time()
    res[i] = (t0, first, time.time(), tokens)
    c.close()


def worker(queue, res, lock):
    while True:
        with lock:
            if not queue:
                return
            i = queue.pop()
        one(i, res)


res = [None] * N
queue, lock = list(range(N - 1, -1, -1)), threading.Lock()
t0 = time.time()
threads = [threading.Thread(target=worker, args=(queue, res, lock)) for _ in range(min(C, N))]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.time() - t0
proc.terminate()


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))]


out = sum(r[3] for r in res)
ttft = [1e3 * (r[1] - r[0]) for r in res]
tpot = [1e3 * (r[2] - r[1]) / (r[3] - 1) for r in res if r[3] > 1]
print(f"serve: {N} requests of {IN} + {OUT} tokens, {min(C, N)} at a time, in {wall:.2f} s: {N / wall:.2f} req/s, "
      f"{out / wall:.1f} output tok/s, {(N * IN + out) / wall:.1f} total tok/s")
print(f"TTFT p50 {pct(ttft, 0.5):.1f} ms, p99 {pct(ttft, 0.99):.1f} ms; TPOT p50 {pct(tpot, 0.5):.2f} ms, "
      f"p99 {pct(tpot, 0.99):.2f} ms; {out} of {N * OUT} tokens")
