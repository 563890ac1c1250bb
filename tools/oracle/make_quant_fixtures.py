#!/usr/bin/env python3
"""Quantized oracle fixtures (issue 16, docs/QUANTIZATION.md). Run it on the
GPU machine (torch with float8_e4m3fn, transformers 5.17):

    python3 tools/oracle/make_quant_fixtures.py FIXTURE_DIR OUT_DIR [layout,layout,...]

FIXTURE_DIR is an fp32 fixture (tests/fixtures/nh_moe, tests/fixtures/qwen3).
For each layout it writes OUT_DIR/<fixture>_<layout>/:
  config.json (+ quantization_config), hf_quant_config.json (ModelOpt),
  model.safetensors   every "*_proj" linear but o_proj quantized as the
                      producer lays it out; o_proj (on the exclude list),
                      embeddings, lm_head, norms, conv1d, routers as they are
  dequant/            the same model in fp32, its linears replaced by their
                      dequantized values (config.json, model.safetensors)
  golden.json         the fixture's prompts, the greedy tokens and top-2
                      margins of transformers (fp32, CPU) on dequant/
  logits.safetensors  fp32 logits "logits_<i>" of prompt + greedy tokens

Layouts (the same as tests/models/test_quant_checkpoints.c writes):
  modelopt_fp8    weight F8_E4M3, weight_scale (amax / 448), input_scale
  modelopt_nvfp4  weight U8 [out, in/2] (element 2i in the low nibble),
                  weight_scale F8_E4M3 [out, in/16] (block amax / 6 / s2),
                  weight_scale_2 (amax / (6 * 448)), input_scale
  ct_fp8_tensor   compressed-tensors, strategy tensor
  ct_fp8_channel  compressed-tensors, strategy channel: weight_scale [out, 1]
  ct_fp8_block    compressed-tensors, strategy block [128, 128]
  fp8_block_inv   quant_method fp8, weight_block_size [128, 128], weight_scale_inv

Dequantization, in fp32 and in this order: FP8 code * scale; NVFP4
(e2m1 * e4m3(weight_scale)) * weight_scale_2. vllm.c's reference path must
give these logits within 1e-4 (the C test checks it against its own
dequantized checkpoint; this script adds transformers as the oracle).
"""
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nemotron_fixtures import full_logits, greedy, no_dt_clamp  # noqa: E402

LAYOUTS = ["modelopt_fp8", "modelopt_nvfp4", "ct_fp8_tensor", "ct_fp8_channel", "ct_fp8_block", "fp8_block_inv"]
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP8_MAX = 448.0


def to_fp8(x):
    """fp32 -> float8_e4m3fn, round to nearest even, saturated at +-448 (as
    ModelOpt and llm-compressor clamp before the cast)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_f32(q):
    return q.to(torch.float32)


def e2m1_codes(x):
    """Nearest E2M1 code (ties to the even code), saturated at 6; bit 3 the sign.
    The thresholds are the midpoints between magnitudes; ties go to the even
    code (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0,
    3.5 -> 4.0, 5.0 -> 4.0)."""
    a = x.abs()
    c = torch.zeros_like(a, dtype=torch.uint8)
    c = torch.where(a > 0.25, 1, c)
    c = torch.where(a >= 0.75, 2, c)
    c = torch.where(a > 1.25, 3, c)
    c = torch.where(a >= 1.75, 4, c)
    c = torch.where(a > 2.5, 5, c)
    c = torch.where(a >= 3.5, 6, c)
    c = torch.where(a > 5.0, 7, c).to(torch.uint8)
    sign = ((x < 0) | ((x == 0) & (torch.signbit(x)))) & (c > 0)
    return c | (sign.to(torch.uint8) << 3)


def e2m1_f32(codes):
    v = E2M1[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -v, v)


def quantize(name, w, layout):
    """w [R, C] fp32 -> (tensors to write, dequantized fp32 [R, C])."""
    base = name[: -len("weight")]
    R, C = w.shape
    out = {}
    if layout == "modelopt_nvfp4":
        assert C % 16 == 0, f"{name}: nvfp4 needs columns in multiples of 16"
        amax = w.abs().max()
        s2 = (amax / (6.0 * FP8_MAX)).to(torch.float32)
        blocks = w.reshape(R, C // 16, 16)
        bmax = blocks.abs().amax(dim=2)
        bs = to_fp8(bmax / 6.0 / s2)                       # [R, C/16]
        d = (fp8_f32(bs) * s2).unsqueeze(2)                # the block's step
        codes = torch.where(d > 0, e2m1_codes(blocks / torch.where(d > 0, d, 1.0)),
                            torch.zeros_like(blocks, dtype=torch.uint8)).reshape(R, C)
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)  # element 2i in the low nibble
        deq = ((e2m1_f32(codes).reshape(R, C // 16, 16) * fp8_f32(bs).unsqueeze(2)) * s2).reshape(R, C)
        out[name] = packed
        out[base + "weight_scale"] = bs
        out[base + "weight_scale_2"] = s2.reshape(())
        out[base + "input_scale"] = torch.tensor(0.02, dtype=torch.float32)
        return out, deq
    if layout in ("modelopt_fp8", "ct_fp8_tensor"):
        amax = w.abs().max()
        s = torch.where(amax > 0, amax / FP8_MAX, torch.tensor(1.0)).to(torch.float32)
        scale_full = s.expand(R, C)
        stored = s.reshape(())
    elif layout == "ct_fp8_channel":
        amax = w.abs().amax(dim=1, keepdim=True)
        s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).to(torch.float32)  # [R, 1]
        scale_full = s.expand(R, C)
        stored = s
    else:  # 128x128 blocks
        bR, bC = -(-R // 128), -(-C // 128)
        s = torch.ones(bR, bC)
        for i in range(bR):
            for j in range(bC):
                m = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].abs().max()
                s[i, j] = m / FP8_MAX if m > 0 else 1.0
        scale_full = s.repeat_interleave(128, 0)[:R].repeat_interleave(128, 1)[:, :C]
        stored = s
    q = to_fp8(w / scale_full)
    deq = fp8_f32(q) * scale_full
    out[name] = q
    out[base + ("weight_scale_inv" if layout == "fp8_block_inv" else "weight_scale")] = stored.contiguous()
    if layout == "modelopt_fp8":
        out[base + "input_scale"] = torch.tensor(0.02, dtype=torch.float32)
    return out, deq


def quantizable(name, t):
    return t.dim() == 2 and name.endswith("_proj.weight") and "o_proj" not in name


def write_config(fixture, d, layout):
    cfg = json.load(open(os.path.join(fixture, "config.json")))
    glob_ignore = ["lm_head", "*o_proj"]
    if layout.startswith("modelopt"):
        algo = "NVFP4" if layout == "modelopt_nvfp4" else "FP8"
        hq = {"producer": {"name": "modelopt"},
              "quantization": {"quant_algo": algo, "group_size": 16, "exclude_modules": glob_ignore}}
        json.dump(hq, open(os.path.join(d, "hf_quant_config.json"), "w"), indent=2)
    elif layout == "fp8_block_inv":
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [128, 128], "modules_to_not_convert": glob_ignore}
    else:
        strategy = layout[len("ct_fp8_"):]
        wq = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}
        if strategy == "block":
            wq["block_structure"] = [128, 128]
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": wq,
                                          "input_activations": {"num_bits": 8, "type": "float",
                                                                "strategy": "token", "dynamic": True}}},
            "ignore": ["lm_head", "re:.*o_proj$"]}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)


@torch.no_grad()
def make(fixture, out_dir, layout):
    name = f"{os.path.basename(os.path.normpath(fixture))}_{layout}"
    d = os.path.join(out_dir, name)
    dq = os.path.join(d, "dequant")
    os.makedirs(dq, exist_ok=True)
    qt, dt = {}, {}
    with safe_open(os.path.join(fixture, "model.safetensors"), "pt") as f:
        for k in f.keys():
            t = f.get_tensor(k).to(torch.float32)
            if quantizable(k, t):
                q, deq = quantize(k, t, layout)
                qt.update(q)
                dt[k] = deq.contiguous()
            else:
                qt[k] = t.contiguous()
                dt[k] = t.contiguous()
    save_file(qt, os.path.join(d, "model.safetensors"))
    save_file(dt, os.path.join(dq, "model.safetensors"))
    write_config(fixture, d, layout)
    shutil.copy(os.path.join(fixture, "config.json"), os.path.join(dq, "config.json"))

    model = transformers.AutoModelForCausalLM.from_pretrained(dq, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    no_dt_clamp(model)
    golden_in = json.load(open(os.path.join(fixture, "golden.json")))
    steps = len(golden_in["greedy"][0])
    prompts, toks_all, margins_all, logits = [], [], [], {}
    for i, p in enumerate(golden_in["prompts"]):
        toks, margins, _ = greedy(model, p, steps, "cpu")
        logits[f"logits_{i}"] = full_logits(model, p + toks).contiguous()
        prompts.append(p)
        toks_all.append(toks)
        margins_all.append(margins)
    save_file(logits, os.path.join(d, "logits.safetensors"))
    golden = {"prompts": prompts, "greedy": toks_all, "margins": margins_all,
              "min_greedy_margin": min(min(m) for m in margins_all),
              "layout": layout, "source_fixture": os.path.basename(os.path.normpath(fixture)),
              "oracle": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "note": "transformers fp32 on the dequantized weights (dequant/)"}}
    json.dump(golden, open(os.path.join(d, "golden.json"), "w"), indent=1)
    print(f"{name}: {len(prompts)} prompts, min margin {golden['min_greedy_margin']:.2e}", flush=True)


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    layouts = sys.argv[3].split(",") if len(sys.argv) > 3 else LAYOUTS
    for layout in layouts:
        if layout not in LAYOUTS:
            raise SystemExit(f"unknown layout {layout} (expected one of {', '.join(LAYOUTS)})")
        make(sys.argv[1], sys.argv[2], layout)


if __name__ == "__main__":
    main()
