#!/usr/bin/env python3
"""Makes the tiny NemotronH oracle fixtures under tests/fixtures/ with Hugging Face
transformers (nobody here wrote it). Run it on the GPU machine (transformers 5.17):

    python3 tools/oracle/make_nemotron_fixtures.py OUT_DIR

For each case it writes OUT_DIR/<case>/:
  config.json, model.safetensors   the model, as save_pretrained writes them
  golden.json    prompts, greedy tokens (fp32, on the CPU), per-step top-2
                 margins, bf16 greedy tokens and margins (CUDA), oracle versions
  logits.safetensors  fp32 logits "logits_<i>": [len(prompt)+len(greedy), vocab]
                 from one full forward over prompt + greedy tokens; row t
                 predicts token t+1.

Two gotchas the guide names:
- HF's slow (torch) Mamba2 path clamps dt at time_step_min; serving kernels do
  not. Every mixer's time_step_min is set to 0 after init.
- Default init gives near-tie logits. Weights are scaled up, and a seed is kept
  only when every greedy step has a top-2 margin >= 1e-3 and every MoE routing
  decision (top-k experts, top groups) has a margin >= 1e-4.
"""
import json
import math
import os
import sys

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import NemotronHConfig, NemotronHForCausalLM

GREEDY_STEPS = 32
PROMPT_LENS = [1, 7, 19, 40, 13]
VOCAB = 256
MIN_MARGIN = 1e-3
MIN_ROUTE_MARGIN = 1e-4

BASE = dict(
    vocab_size=VOCAB, hidden_size=64, layer_norm_epsilon=1e-5,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=96, mlp_hidden_act="relu2",
    mamba_num_heads=8, mamba_head_dim=8, n_groups=2, ssm_state_size=16,
    conv_kernel=4, expand=1, chunk_size=8, use_conv_bias=True, use_bias=False,
    mlp_bias=False, attention_bias=False, time_step_min=0.01, time_step_max=0.2,
    max_position_embeddings=4096, initializer_range=0.1, tie_word_embeddings=False,
    use_mamba_kernels=False, rescale_prenorm_residual=True,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)

CASES = {
    # dense: Mamba2, attention and relu^2 MLP layers
    "nh_dense": dict(hybrid_override_pattern="M*-M-*M-"),
    # MoE with a shared expert, routed scaling, no top-k normalization
    "nh_moe": dict(hybrid_override_pattern="ME*EM-",
                   n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                   moe_shared_expert_intermediate_size=48, routed_scaling_factor=2.5,
                   n_group=1, topk_group=1, norm_topk_prob=False),
    # grouped top-k routing with latent expert projections
    "nh_latent": dict(hybrid_override_pattern="MEM*E",
                      n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=24,
                      moe_shared_expert_intermediate_size=40, routed_scaling_factor=1.5,
                      n_group=4, topk_group=2, norm_topk_prob=True, moe_latent_size=32),
}


def make_model(case_kw, seed):
    torch.manual_seed(seed)
    kw = dict(BASE)
    kw.update(case_kw)
    cfg = NemotronHConfig(**kw)
    cfg._attn_implementation = "eager"
    model = NemotronHForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("conv1d.bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".D"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith("gate.weight"):  # MoE router: spread the scores
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name == "lm_head.weight":
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))
    cfg.time_step_min = 0.0
    no_dt_clamp(model)
    return model


def no_dt_clamp(model):
    """Serving kernels do not clamp dt at time_step_min. transformers 5.17 keeps
    the clamp as each mixer's time_step_limit = (time_step_min, inf) and applies
    it in prefill only; older versions clamp with time_step_min."""
    for m in model.modules():
        if hasattr(m, "time_step_limit"):
            m.time_step_limit = (0.0, float("inf"))
        if hasattr(m, "time_step_min"):
            m.time_step_min = 0.0


class RouteWatch:
    """Records the smallest routing margin seen by any MoE router."""

    def __init__(self, model):
        self.min_margin = math.inf
        self.hooks = []
        for m in model.modules():
            if type(m).__name__ == "NemotronHMoE":
                self.hooks.append(m.gate.register_forward_hook(self.make_hook(m)))

    def make_hook(self, moe):
        def hook(gate, _inp, out):
            logits = out[0] if isinstance(out, tuple) else out  # 5.17: (logits, weights, ids)
            s = logits.float().sigmoid() + gate.e_score_correction_bias.float()
            E, ng, tg, k = gate.num_experts, gate.num_group, gate.topk_group, gate.top_k
            gs = s.view(-1, ng, E // ng).topk(2, dim=-1)[0].sum(-1)  # [T, ng]
            if tg < ng:
                srt = gs.sort(dim=-1, descending=True)[0]
                self.min_margin = min(self.min_margin, (srt[:, tg - 1] - srt[:, tg]).min().item())
            keep = torch.zeros_like(gs).scatter_(1, gs.topk(tg, dim=-1)[1], 1)
            mask = keep.unsqueeze(-1).expand(-1, ng, E // ng).reshape(-1, E).bool()
            srt = s.masked_fill(~mask, -1e9).sort(dim=-1, descending=True)[0]
            if k < mask.sum(-1).min().item():
                self.min_margin = min(self.min_margin, (srt[:, k - 1] - srt[:, k]).min().item())
        return hook

    def close(self):
        for h in self.hooks:
            h.remove()


@torch.no_grad()
def greedy(model, prompt, steps, device):
    """Prefill + cached decode, the way generate() runs, without its EOS logic."""
    ids = torch.tensor([prompt], device=device)
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    toks, margins, step_logits = [], [], []
    logits = out.logits[0, -1].float()
    for _ in range(steps):
        top2 = logits.topk(2)
        toks.append(int(top2.indices[0]))
        margins.append(float(top2.values[0] - top2.values[1]))
        step_logits.append(logits.cpu())
        out = model(input_ids=torch.tensor([[toks[-1]]], device=device), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
    return toks, margins, torch.stack(step_logits)


@torch.no_grad()
def full_logits(model, seq):
    out = model(input_ids=torch.tensor([seq]), use_cache=False)
    return out.logits[0].float()


def make_case(name, case_kw, out_dir):
    for seed in range(1000, 1100):
        model = make_model(case_kw, seed)
        g = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS]
        watch = RouteWatch(model)
        ok, results = True, []
        for p in prompts:
            toks, margins, step_logits = greedy(model, p, GREEDY_STEPS, "cpu")
            full = full_logits(model, p + toks)
            # the full forward must agree with prefill + decode
            dec_vs_full = (full[len(p) - 1:len(p) - 1 + GREEDY_STEPS] - step_logits).abs().max().item()
            if min(margins) < MIN_MARGIN or dec_vs_full > 1e-4:
                print(f"{name}: seed {seed} rejected: margin {min(margins):.2e}, decode-vs-full {dec_vs_full:.2e}", flush=True)
                ok = False
                break
            results.append((p, toks, margins, full, dec_vs_full))
        route_margin = watch.min_margin
        watch.close()
        if not ok or route_margin < MIN_ROUTE_MARGIN:
            print(f"{name}: seed {seed} rejected (route margin {route_margin:.2e})", flush=True)
            continue
        break
    else:
        raise SystemExit(f"{name}: no seed gave clear margins")

    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    # Round trip: the checkpoint as a user loads it must give the same logits.
    reloaded = NemotronHForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    no_dt_clamp(reloaded)
    roundtrip = max((full_logits(reloaded, r[0] + r[1]) - r[3]).abs().max().item() for r in results)
    assert roundtrip < 1e-5, f"{name}: save/load round trip changed logits by {roundtrip}"
    save_file({f"logits_{i}": r[3].contiguous() for i, r in enumerate(results)},
              os.path.join(d, "logits.safetensors"))
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        keys = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}

    golden = {
        "prompts": [r[0] for r in results],
        "greedy": [r[1] for r in results],
        "margins": [r[2] for r in results],
        "seed": seed,
        "min_greedy_margin": min(min(r[2]) for r in results),
        "min_route_margin": route_margin if route_margin != math.inf else None,
        "max_decode_vs_full_logits": max(r[4] for r in results),
    }
    if torch.cuda.is_available():
        # bf16 as a user runs it: from_pretrained in bf16 on the GPU
        mb = NemotronHForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
        no_dt_clamp(mb)
        gb, mgb = [], []
        for p in golden["prompts"]:
            toks, margins, _ = greedy(mb, p, GREEDY_STEPS, "cuda")
            gb.append(toks)
            mgb.append(margins)
        golden["greedy_bf16"] = gb
        golden["margins_bf16"] = mgb
        golden["bf16_agree_steps"] = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
                                      for x, y in zip(golden["greedy"], gb)]
    golden["oracle"] = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device_bf16": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "script": "tools/oracle/make_nemotron_fixtures.py",
    }
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f)
    print(f"{name}: seed {seed}, min margin {golden['min_greedy_margin']:.2e}, "
          f"route margin {golden['min_route_margin']}, decode-vs-full {golden['max_decode_vs_full_logits']:.2e}, "
          f"bf16 agree {golden.get('bf16_agree_steps')}", flush=True)
    print(json.dumps(keys), flush=True)
    return keys


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    torch.set_grad_enabled(False)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES)
    failed = []
    for name in only:
        try:
            make_case(name, CASES[name], out_dir)
        except Exception as e:  # report every case, then fail
            import traceback
            traceback.print_exc()
            failed.append(name)
    if failed:
        raise SystemExit(f"failed: {failed}")


if __name__ == "__main__":
    main()
