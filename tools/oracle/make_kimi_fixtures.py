#!/usr/bin/env python3
"""Makes the Kimi-Linear oracle fixtures (tests/fixtures/kimi_linear,
tests/fixtures/kimi_linear_qlora) with transformers 5.17 on the GPU machine:

    python3 tools/oracle/make_kimi_fixtures.py OUT_DIR        (or: CASES=kimi_linear,kimi_linear_qlora
                                                                tools/oracle/device_fixtures.sh)

The cases live in make_family_fixtures.py (golden.json's oracle.script names
it), beside the other families: this entry point runs them and then checks
that each fixture covers what issue 18 asks of it, reading only the files it
wrote, so that a changed case cannot silently drop a requirement:
  - KDA and MLA layers both present (layer_types), with linear_attn_config's
    1-indexed kda_layers / full_attn_layers agreeing with them;
  - a dense first layer and MoE after it (mlp_layer_types);
  - q_lora_rank null (kimi_linear) and a rank (kimi_linear_qlora);
  - a 1-token prompt and a prompt longer than the KDA chunk (64, fla's chunk_kda);
  - every greedy step's top-2 margin >= 1e-3 and every routing margin >= 1e-4;
  - logits.safetensors holding prompt + greedy rows for every prompt.
transformers' own generate needs explicit layer_types with a full-attention
layer, which both cases set.
"""
import json
import os
import subprocess
import sys

CASES = ["kimi_linear", "kimi_linear_qlora"]
KDA_CHUNK = 64


def check(fx_dir, name):
    cfg = json.load(open(os.path.join(fx_dir, "config.json")))
    gold = json.load(open(os.path.join(fx_dir, "golden.json")))
    lt, mt, la = cfg["layer_types"], cfg["mlp_layer_types"], cfg["linear_attn_config"]
    problems = []
    if "linear_attention" not in lt or "full_attention" not in lt:
        problems.append("layer_types lacks KDA or MLA layers")
    if sorted(la["kda_layers"]) != [i + 1 for i, t in enumerate(lt) if t == "linear_attention"] or \
            sorted(la["full_attn_layers"]) != [i + 1 for i, t in enumerate(lt) if t == "full_attention"]:
        problems.append("linear_attn_config's layer lists disagree with layer_types")
    if mt[0] != "dense" or "sparse" not in mt[1:]:
        problems.append("mlp_layer_types is not a dense first layer with MoE after it")
    if (cfg["q_lora_rank"] is None) != (name == "kimi_linear"):
        problems.append("q_lora_rank is not null for kimi_linear / a rank for kimi_linear_qlora")
    lens = [len(p) for p in gold["prompts"]]
    if 1 not in lens or max(lens) <= KDA_CHUNK:
        problems.append(f"prompt lengths {lens}: need a 1-token prompt and one longer than {KDA_CHUNK}")
    if gold["min_greedy_margin"] < 1e-3 or gold["min_route_margin"] < 1e-4:
        problems.append("margins below 1e-3 (greedy) / 1e-4 (routing)")
    if len(gold["greedy"]) != len(gold["prompts"]) or len(gold["greedy_bf16"]) != len(gold["prompts"]):
        problems.append("greedy / greedy_bf16 do not cover every prompt")
    with open(os.path.join(fx_dir, "logits.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    for i, (p, g) in enumerate(zip(gold["prompts"], gold["greedy"])):
        shape = header.get(f"logits_{i}", {}).get("shape")
        if shape != [len(p) + len(g), cfg["vocab_size"]]:
            problems.append(f"logits_{i} has shape {shape}, not [{len(p) + len(g)}, {cfg['vocab_size']}]")
    for p in problems:
        print(f"{name}: {p}", file=sys.stderr)
    return not problems


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    if "--check-only" not in sys.argv:
        subprocess.run([sys.executable, os.path.join(here, "make_family_fixtures.py"), out, ",".join(CASES)],
                       check=True)
    ok = all(check(os.path.join(out, c), c) for c in CASES)
    print("kimi fixtures: " + ("every requirement covered" if ok else "REQUIREMENTS MISSING"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
