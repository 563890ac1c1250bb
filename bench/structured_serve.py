#!/usr/bin/env python3
"""structured_serve.py - decode throughput of `vllm serve` with and without
structured output, N concurrent chat requests of a fixed length.

Usage: bench/structured_serve.py VLLM MODEL_DIR [N [MAX_TOKENS [EXTRA_SERVE_ARGS...]]]
  TEMPERATURE=t (env, default 0: greedy, so the sampler's own cost does not
  depend on how many ids the mask leaves)
Every request sets ignore_eos, so each makes MAX_TOKENS tokens; the schemas
keep the grammar active for all of them (a long string: most of the
vocabulary allowed; a long integer array: a narrow mask). Prints completion
tokens per second per case, and each constrained case against "none".
"""
import json, os, sys, threading, time, urllib.request

from serve_proc import start_server

vllm, model = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 32
T = int(sys.argv[4]) if len(sys.argv) > 4 else 64
extra = sys.argv[5:]

CASES = [
    ("none", {}),
    ("none (again)", {}),
    ("json_object", {"response_format": {"type": "json_object"}}),
    ("string schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "properties": {"text": {"type": "string", "minLength": 2000}}, "required": ["text"]}}}}),
    ("int array schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "array", "items": {"type": "integer"}, "minItems": 200}}}}),
]

proc, port = start_server(vllm, model, extra)


def one(body, out, i):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        out[i] = json.load(r)["usage"]["completion_tokens"]


def run(extra_body):
    body = {"messages": [{"role": "user", "content": "Write JSON."}], "max_tokens": T, "ignore_eos": True,
            "temperature": float(os.environ.get("TEMPERATURE", "0")), **extra_body}
    one(dict(body, max_tokens=2), [0], 0)  # compile (and warm) once, off the clock, as a registry hit later
    out = [0] * N
    t0 = time.time()
    th = [threading.Thread(target=one, args=(dict(body, seed=i), out, i)) for i in range(N)]
    for t in th: t.start()
    for t in th: t.join()
    return sum(out) / (time.time() - t0)


base = None
for name, extra_body in CASES:
    tps = run(extra_body)
    base = base or tps
    print(f"{name:18s} {tps:8.1f} tok/s  ({100 * tps / base:5.1f}% of none)", flush=True)
proc.terminate()
proc.wait()
