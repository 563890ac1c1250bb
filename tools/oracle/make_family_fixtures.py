#!/usr/bin/env python3
"""Makes tiny random-weight oracle fixtures for the families beside NemotronH
with Hugging Face transformers (nobody here wrote it). Run it on the GPU
machine (transformers 5.17):

    python3 tools/oracle/make_family_fixtures.py OUT_DIR [case,case,...]
    python3 tools/oracle/make_family_fixtures.py --prefix FIXTURE_DIR ARCH OUT_DIR   (writes OUT_DIR/prefix/)

Each case writes OUT_DIR/<case>/ as make_nemotron_fixtures.py does:
config.json + model.safetensors (save_pretrained), golden.json (prompts, fp32
greedy tokens and top-2 margins, bf16 greedy tokens and margins on CUDA,
versions) and logits.safetensors (fp32 logits of prompt + greedy tokens).

--prefix writes prefix/golden.json and prefix/logits.safetensors for an existing
fixture: a shared-prefix prompt set (a prefix P, P plus tails of several
lengths, P again, P cut in the middle of a 16-token block) for prefix caching.

Gotchas the guide names: Mamba2's slow path clamps dt at time_step_min (set
to 0 after init); weights are scaled so every greedy step has a top-2 margin
>= 1e-3, and every MoE routing decision a margin >= 1e-4.
"""
import json
import math
import os
import sys

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nemotron_fixtures import full_logits, greedy, no_dt_clamp  # noqa: E402

GREEDY_STEPS = 32
PROMPT_LENS = [1, 7, 19, 40, 100, 13]
VOCAB = 256
MIN_MARGIN = 1e-3
MIN_ROUTE_MARGIN = 1e-4

ATTN = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            max_position_embeddings=4096, initializer_range=0.1, hidden_act="silu",
            pad_token_id=0, bos_token_id=1, eos_token_id=2)


def rope(cfg_cls, theta, scaling):
    """rope_parameters (transformers 5) when the class has it, else the hub's keys."""
    if "rope_parameters" in getattr(cfg_cls, "__dataclass_fields__", {}) or \
            "rope_parameters" in getattr(cfg_cls, "__annotations__", {}):
        p = {"rope_type": "default", "rope_theta": theta}
        p.update(scaling or {})
        return {"rope_parameters": p}
    return {"rope_theta": theta, "rope_scaling": scaling}


def cases():
    T = transformers
    c = {}
    c["qwen3_tied"] = (T.Qwen3Config, T.Qwen3ForCausalLM,
                       dict(ATTN, tie_word_embeddings=True, **rope(T.Qwen3Config, 10000.0, None)))
    c["qwen3"] = (T.Qwen3Config, T.Qwen3ForCausalLM,
                  dict(ATTN, tie_word_embeddings=False, num_key_value_heads=1, **rope(T.Qwen3Config, 1e6, None)))
    c["qwen3_moe"] = (T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM,
                      dict(ATTN, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                           moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                           mlp_only_layers=[1], **rope(T.Qwen3MoeConfig, 10000.0, None)))
    c["qwen3_moe_nonorm"] = (T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM,
                             dict(ATTN, num_hidden_layers=3, tie_word_embeddings=False, num_experts=16,
                                  num_experts_per_tok=4, moe_intermediate_size=24, norm_topk_prob=False,
                                  decoder_sparse_step=2, mlp_only_layers=[], **rope(T.Qwen3MoeConfig, 10000.0, None)))
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 32}
    c["llama3"] = (T.LlamaConfig, T.LlamaForCausalLM,
                   dict(ATTN, tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
                        **rope(T.LlamaConfig, 500000.0, llama3)))
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    c["llama_yarn"] = (T.LlamaConfig, T.LlamaForCausalLM,
                       dict(ATTN, tie_word_embeddings=True, num_key_value_heads=4,
                            **rope(T.LlamaConfig, 10000.0, yarn)))
    lin = {"rope_type": "linear", "factor": 2.0}
    c["llama_linear"] = (T.LlamaConfig, T.LlamaForCausalLM,
                         dict(ATTN, head_dim=None, hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                              **rope(T.LlamaConfig, 10000.0, lin)))
    c["qwen2"] = (T.Qwen2Config, T.Qwen2ForCausalLM,
                  dict({k: v for k, v in ATTN.items() if k != "head_dim"}, tie_word_embeddings=False,
                       **rope(T.Qwen2Config, 10000.0, None)))
    c["mamba2"] = (T.Mamba2Config, T.Mamba2ForCausalLM,
                   dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_heads=8, head_dim=8, expand=2,
                        state_size=16, n_groups=2, conv_kernel=4, chunk_size=8, use_conv_bias=True, use_bias=False,
                        residual_in_fp32=True, layer_norm_epsilon=1e-5, tie_word_embeddings=False,
                        time_step_min=0.01, time_step_max=0.2, initializer_range=0.1, rescale_prenorm_residual=False,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2))
    kimi = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
                q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, rms_norm_eps=1e-5,
                num_experts=8, num_experts_per_token=2, num_shared_experts=1, routed_scaling_factor=2.446,
                num_expert_group=2, topk_group=1, moe_renormalize=True, hidden_act="silu",
                layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
                linear_attn_config={"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4,
                                    "kda_layers": [1, 3, 4], "full_attn_layers": [2]},
                linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4,
                max_position_embeddings=4096, initializer_range=0.1, tie_word_embeddings=False,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if hasattr(T, "KimiLinearConfig"):
        c["kimi_linear"] = (T.KimiLinearConfig, T.KimiLinearForCausalLM, kimi)
        c["kimi_linear_qlora"] = (T.KimiLinearConfig, T.KimiLinearForCausalLM,
                                  dict(kimi, q_lora_rank=24, layer_types=["full_attention", "linear_attention",
                                                                          "full_attention", "linear_attention"],
                                       linear_attn_config={"head_dim": 16, "num_heads": 4,
                                                           "short_conv_kernel_size": 4, "kda_layers": [2, 4],
                                                           "full_attn_layers": [1, 3]},
                                       mlp_layer_types=["dense", "sparse", "dense", "sparse"]))
    return c


def make_model(cfg_cls, model_cls, kw, seed):
    torch.manual_seed(seed)
    cfg = cfg_cls(**kw)
    cfg._attn_implementation = "eager"
    model = model_cls(cfg).float().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm_f.weight") or "layernorm" in name \
                    or name.endswith("_norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias") and p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".D"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif name.endswith("gate.weight") and p.shape[0] <= 64:  # MoE router: spread the scores
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name == "lm_head.weight":
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))
    if hasattr(cfg, "time_step_min") and not isinstance(cfg, transformers.Mamba2Config):
        cfg.time_step_min = 0.0  # (Mamba2's init takes log(time_step_min) again on reload; its clamp is time_step_limit)
    no_dt_clamp(model)
    return model


class RouteWatch:
    """The smallest routing margin of any MoE block: recomputed from the
    router's input (pre-hook), softmax top-k (Qwen3-MoE: the margin of the
    logits, which order the experts as the probabilities do) or sigmoid +
    bias grouped top-k (Kimi-Linear)."""

    def __init__(self, model):
        self.min_margin = math.inf
        self.hooks = []
        for m in model.modules():
            n = type(m).__name__
            if n.endswith("SparseMoeBlock") or n.endswith("MoE") or n.endswith("MoeBlock"):
                gate = getattr(m, "gate", None)
                if gate is not None and hasattr(gate, "weight"):
                    self.hooks.append(m.register_forward_pre_hook(self.make_hook(m, gate)))

    def make_hook(self, block, gate):
        def hook(_mod, args, kwargs=None):
            x = args[0] if args else kwargs["hidden_states"]
            x = x.reshape(-1, x.shape[-1]).float()
            logits = x @ gate.weight.float().t()
            E = logits.shape[-1]
            bias = getattr(gate, "e_score_correction_bias", None)
            cfg = getattr(block, "config", None)
            k = getattr(gate, "top_k", None) or getattr(block, "top_k", None) or \
                getattr(cfg, "num_experts_per_tok", None)
            if bias is None:  # softmax is monotonic: the top-k of the logits, margins in logits
                srt = logits.sort(-1, descending=True)[0]
                self.min_margin = min(self.min_margin, (srt[:, k - 1] - srt[:, k]).min().item())
                return None
            s = logits.sigmoid() + bias.float()
            ng = getattr(gate, "num_expert_group", None) or getattr(gate, "n_group", None) or 1
            tg = getattr(gate, "topk_group", None) or 1
            gs = s.view(-1, ng, E // ng).topk(min(2, E // ng), dim=-1)[0].sum(-1)
            if tg < ng:
                srt = gs.sort(dim=-1, descending=True)[0]
                self.min_margin = min(self.min_margin, (srt[:, tg - 1] - srt[:, tg]).min().item())
            keep = torch.zeros_like(gs).scatter_(1, gs.topk(tg, dim=-1)[1], 1)
            mask = keep.unsqueeze(-1).expand(-1, ng, E // ng).reshape(-1, E).bool()
            srt = s.masked_fill(~mask, -1e9).sort(dim=-1, descending=True)[0]
            if k < mask.sum(-1).min().item():
                self.min_margin = min(self.min_margin, (srt[:, k - 1] - srt[:, k]).min().item())
            return None
        return hook

    def close(self):
        for h in self.hooks:
            h.remove()


@torch.no_grad()
def greedy_recompute(model, prompt, steps, device):
    """Greedy by a full forward per step (models whose output has no
    past_key_values, e.g. Mamba2's cache_params): the same tokens, no cache."""
    seq, toks, margins, step_logits = list(prompt), [], [], []
    for _ in range(steps):
        logits = model(input_ids=torch.tensor([seq], device=device), use_cache=False).logits[0, -1].float()
        top2 = logits.topk(2)
        toks.append(int(top2.indices[0]))
        margins.append(float(top2.values[0] - top2.values[1]))
        step_logits.append(logits.cpu())
        seq.append(toks[-1])
    return toks, margins, torch.stack(step_logits)


def greedy_any(model, prompt, steps, device):
    return (greedy_recompute if isinstance(model, transformers.Mamba2ForCausalLM) else greedy)(model, prompt, steps, device)


def run_prompts(model, prompts):
    results = []
    for p in prompts:
        toks, margins, step_logits = greedy_any(model, p, GREEDY_STEPS, "cpu")
        full = full_logits(model, p + toks)
        dec_vs_full = (full[len(p) - 1:len(p) - 1 + GREEDY_STEPS] - step_logits).abs().max().item()
        results.append((p, toks, margins, full, dec_vs_full))
    return results


def bf16_goldens(model_cls, d, prompts, golden):
    if not torch.cuda.is_available():
        return
    mb = model_cls.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager").cuda().eval()
    no_dt_clamp(mb)
    gb, mgb = [], []
    for p in prompts:
        toks, margins, _ = greedy_any(mb, p, GREEDY_STEPS, "cuda")
        gb.append(toks)
        mgb.append(margins)
    golden["greedy_bf16"] = gb
    golden["margins_bf16"] = mgb
    golden["bf16_agree_steps"] = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
                                  for x, y in zip(golden["greedy"], gb)]
    del mb


def versions(script):
    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "device_bf16": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "script": script}


def make_case(name, spec, out_dir):
    cfg_cls, model_cls, kw = spec
    for seed in range(1000, 1060):
        model = make_model(cfg_cls, model_cls, kw, seed)
        g = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS]
        watch = RouteWatch(model)
        results = run_prompts(model, prompts)
        route_margin = watch.min_margin
        watch.close()
        mm = min(min(r[2]) for r in results)
        dvf = max(r[4] for r in results)
        if mm < MIN_MARGIN or dvf > 1e-4 or route_margin < MIN_ROUTE_MARGIN:
            print(f"{name}: seed {seed} rejected: margin {mm:.2e} route {route_margin:.2e} dec-vs-full {dvf:.2e}",
                  flush=True)
            continue
        break
    else:
        raise RuntimeError(f"{name}: no seed gave clear margins")
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    reloaded = model_cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    no_dt_clamp(reloaded)
    roundtrip = max((full_logits(reloaded, r[0] + r[1]) - r[3]).abs().max().item() for r in results)
    assert roundtrip < 1e-5, f"{name}: save/load round trip changed logits by {roundtrip}"
    save_file({f"logits_{i}": r[3].contiguous() for i, r in enumerate(results)}, os.path.join(d, "logits.safetensors"))
    golden = {"prompts": [r[0] for r in results], "greedy": [r[1] for r in results],
              "margins": [r[2] for r in results], "seed": seed, "min_greedy_margin": mm,
              "min_route_margin": route_margin if route_margin != math.inf else None,
              "max_decode_vs_full_logits": dvf}
    bf16_goldens(model_cls, d, golden["prompts"], golden)
    golden["oracle"] = versions("tools/oracle/make_family_fixtures.py")
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f)
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        keys = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    print(f"{name}: seed {seed}, min margin {mm:.2e}, route margin {golden['min_route_margin']}, "
          f"dec-vs-full {dvf:.2e}, bf16 agree {golden.get('bf16_agree_steps')}", flush=True)
    print(name, "tensors:", json.dumps(keys), flush=True)


def prefix_prompts(seed):
    """P (37 tokens), P + tails, P again, P cut mid-block (29 = 16 + 13)."""
    g = torch.Generator().manual_seed(seed)
    P = torch.randint(3, VOCAB, (37,), generator=g).tolist()
    tail = lambda n: torch.randint(3, VOCAB, (n,), generator=g).tolist()  # noqa: E731
    return [P, P + tail(5), P + tail(23), list(P), P[:29], P + tail(60), P[:29] + tail(11)]


def make_prefix(fixture_dir, arch, out_dir):
    model_cls = getattr(transformers, arch)
    model = model_cls.from_pretrained(fixture_dir, dtype=torch.float32, attn_implementation="eager").eval()
    no_dt_clamp(model)
    results = run_prompts(model, prefix_prompts(77))
    golden = {"prompts": [r[0] for r in results], "greedy": [r[1] for r in results],
              "margins": [r[2] for r in results], "min_greedy_margin": min(min(r[2]) for r in results),
              "max_decode_vs_full_logits": max(r[4] for r in results),
              "oracle": versions("tools/oracle/make_family_fixtures.py --prefix")}
    out_dir = os.path.join(out_dir, "prefix")  # not beside the weights: a model dir's *.safetensors are its weights
    os.makedirs(out_dir, exist_ok=True)
    save_file({f"logits_{i}": r[3].contiguous() for i, r in enumerate(results)},
              os.path.join(out_dir, "logits.safetensors"))
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(golden, f)
    print(f"prefix {fixture_dir}: min margin {golden['min_greedy_margin']:.2e}", flush=True)


def main():
    torch.set_grad_enabled(False)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
    if sys.argv[1] == "--prefix":
        make_prefix(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    out_dir = sys.argv[1]
    all_cases = cases()
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(all_cases)
    failed = []
    for name in only:
        try:
            make_case(name, all_cases[name], out_dir)
        except Exception:  # report every case, then fail
            import traceback
            traceback.print_exc()
            failed.append(name)
    if failed:
        raise SystemExit(f"failed: {failed}")


if __name__ == "__main__":
    main()
