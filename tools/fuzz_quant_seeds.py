#!/usr/bin/env python3
"""Seeds of tests/fuzz/fuzz_quant_load.c: one valid quantized checkpoint per
layout of the harness (byte 0: the layout; then model.safetensors) of its
one-layer Qwen3 (hidden 32, q 2 x 16, kv 1 x 16, intermediate 32, vocab 8).
Every *_proj linear but o_proj is quantized; the rest is F32. Pure Python
(no numpy / torch), deterministic:

    python3 tools/fuzz_quant_seeds.py tests/fuzz/corpus/quant_load
"""
import json
import os
import random
import struct
import sys

LAYOUTS = ["modelopt_fp8", "modelopt_nvfp4", "ct_fp8_tensor", "ct_fp8_channel", "ct_fp8_block", "fp8_block_inv"]
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e4m3_value(b):
    s, e, m = b >> 7, (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        return None  # NaN
    v = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
    return -v if s else v


E4M3 = [(b, e4m3_value(b)) for b in range(256) if e4m3_value(b) is not None]


def e4m3(x):
    x = max(-448.0, min(448.0, x))
    return min(E4M3, key=lambda bv: (abs(bv[1] - x), bv[0] & 1))[0]


def e2m1(x):
    c = min(range(8), key=lambda i: (abs(E2M1[i] - abs(x)), i & 1))
    return c | (8 if x < 0 and c else 0)


def tensor(dtype, shape, data):
    return {"dtype": dtype, "shape": shape, "data": data}


def f32(shape, vals):
    return tensor("F32", shape, struct.pack(f"<{len(vals)}f", *vals))


def quantize(name, R, C, w, layout, out):
    base = name[: -len("weight")]
    if layout == "modelopt_nvfp4":
        s2 = max(abs(v) for v in w) / (6 * 448) or 1.0
        codes, bsc = [], []
        for r in range(R):
            for b in range(C // 16):
                blk = w[r * C + b * 16: r * C + b * 16 + 16]
                bs = e4m3(max(abs(v) for v in blk) / 6 / s2)
                bsc.append(bs)
                d = e4m3_value(bs) * s2
                codes += [e2m1(v / d) if d else 0 for v in blk]
        packed = bytes(codes[i] | (codes[i + 1] << 4) for i in range(0, len(codes), 2))
        out[name] = tensor("U8", [R, C // 2], packed)
        out[base + "weight_scale"] = tensor("F8_E4M3", [R, C // 16], bytes(bsc))
        out[base + "weight_scale_2"] = f32([], [s2])
        out[base + "input_scale"] = f32([], [0.02])
        return
    if layout in ("modelopt_fp8", "ct_fp8_tensor"):
        s = [max(abs(v) for v in w) / 448 or 1.0]
        scale_of = lambda r, c: s[0]  # noqa: E731
        stored = f32([], s)
    elif layout == "ct_fp8_channel":
        s = [max(abs(v) for v in w[r * C:(r + 1) * C]) / 448 or 1.0 for r in range(R)]
        scale_of = lambda r, c: s[r]  # noqa: E731
        stored = f32([R, 1], s)
    else:  # 128 x 128 blocks: these matrices are one block
        s = [max(abs(v) for v in w) / 448 or 1.0]
        scale_of = lambda r, c: s[0]  # noqa: E731
        stored = f32([1, 1], s)
    out[name] = tensor("F8_E4M3", [R, C], bytes(e4m3(w[r * C + c] / scale_of(r, c)) for r in range(R) for c in range(C)))
    out[base + ("weight_scale_inv" if layout == "fp8_block_inv" else "weight_scale")] = stored
    if layout == "modelopt_fp8":
        out[base + "input_scale"] = f32([], [0.02])


def checkpoint(layout):
    rng = random.Random(1)
    rand = lambda n: [rng.uniform(-0.1, 0.1) for _ in range(n)]  # noqa: E731
    D, I, Q, KV, V = 32, 32, 32, 16, 8
    p = "model.layers.0."
    out = {"model.embed_tokens.weight": f32([V, D], rand(V * D)), "lm_head.weight": f32([V, D], rand(V * D)),
           "model.norm.weight": f32([D], [1.0] * D), p + "input_layernorm.weight": f32([D], [1.0] * D),
           p + "post_attention_layernorm.weight": f32([D], [1.0] * D),
           p + "self_attn.q_norm.weight": f32([16], [1.0] * 16), p + "self_attn.k_norm.weight": f32([16], [1.0] * 16),
           p + "self_attn.o_proj.weight": f32([D, Q], rand(D * Q))}
    for name, R, C in [("self_attn.q_proj", Q, D), ("self_attn.k_proj", KV, D), ("self_attn.v_proj", KV, D),
                       ("mlp.gate_proj", I, D), ("mlp.up_proj", I, D), ("mlp.down_proj", D, I)]:
        quantize(p + name + ".weight", R, C, rand(R * C), layout, out)
    header, blob = {}, b""
    for k in sorted(out):
        t = out[k]
        header[k] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [len(blob), len(blob) + len(t["data"])]}
        blob += t["data"]
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    os.makedirs(sys.argv[1], exist_ok=True)
    for i, layout in enumerate(LAYOUTS):
        with open(os.path.join(sys.argv[1], layout), "wb") as f:
            f.write(bytes([i]) + checkpoint(layout))


if __name__ == "__main__":
    main()
