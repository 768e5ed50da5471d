#!/usr/bin/env python3
"""Golden fixtures from the real Hugging Face `transformers` modeling code.

Design. For each architecture (llama, llama3_rope, qwen2, qwen3, qwen3_moe) this builds a tiny
model with the installed transformers' own classes, on CPU, in float32, with eager attention
(asserted), one thread and deterministic algorithms, and writes an architecture folder:

  config.json, model.safetensors   PreTrainedModel.save_pretrained (so the config is in the
                                   spelling of that transformers version)
  golden.safetensors               inputs and reference outputs of four cases, the names of
                                   tests/fixtures/hf/README.md (what tests/unit/hf_golden_test.cpp reads)

plus, at the top, summary.json: provenance (transformers / torch / safetensors versions), the
statistics and the checks below. The recipe is the one of the 4.51.3 set (tests/fixtures/hf):
weight seed 0 (torch.manual_seed, then Model(config), HF's own _init_weights), every RMSNorm
weight then 1 + 0.1*N(0,1) and every bias 0.1*N(0,1) from a generator seeded with seed+1000
in named_parameters() order; input seed 1 (ids = randint(0, 512, (2, 24))).

Cases (all forwards are training forwards: use_cache=False, no KV cache):
  1  plain batch, labels = ids; gradients of loss_case1 for a few parameters
  2  row 1 left-padded with 5 pads (id 0), 2-D attention mask, position_ids cumsum(mask)-1
     with pads at 1, labels -100 at the pads
  3  row 0 holds two documents by its position_ids (0..9, 0..13), no attention mask. What
     this pins depends on the version: 4.51 attends causally across the whole row;
     transformers 5 infers documents from position_ids that do not step by +1 (when no
     attention mask and no cache are given) and masks across them. The golden file's
     metadata says which: case3_attention = "causal" or "document".
  4  case 3 plus an explicit additive 4-D block-diagonal causal mask (MoE: no router
     logits, since HF's aux loss takes 2-D masks only)

Checks recorded in summary.json: a second run gives identical tensors, a run on 2 threads too; the
same code in float64; cross-case identities; what case 3 gives with a 2-D all-ones mask and
with the config's use_cache (a cache disables the packed-sequence inference); MoE loss ==
lm_loss + coef*aux and the routing margin; reloading the folder with from_pretrained gives
the same logits. --compare DIR measures how far another fixture set (same recipe) is.

Usage: python scripts/make_hf_fixtures.py --out tests/fixtures/hf5 [--compare tests/fixtures/hf]

--model-only writes one architecture's model folder and nothing else (no cases, no summary),
with config values changed by --set and the tokenizer files of --tokenizer copied in: the
benchmarks' models, e.g. the 103 M Qwen3 with the real 151,936-token vocabulary of
scripts/bench_vs_llamafactory.sh:
  python scripts/make_hf_fixtures.py --model-only --archs qwen3 --out /tmp/qwen3_103m \
    --set vocab_size=151936 hidden_size=512 intermediate_size=1536 num_hidden_layers=8 \
          num_attention_heads=8 num_key_value_heads=4 head_dim=64 initializer_range=0.02 \
    --tokenizer tests/fixtures/tokenizer/qwen3
"""
import argparse
import copy
import json
import os
import platform
import sys

import torch

import safetensors
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

WEIGHT_SEED, INPUT_SEED = 0, 1
VOCAB, BATCH, SEQ, PADS = 512, 2, 24, 5
DOC0_LEN = 10  # case 3/4: row 0 = positions 0..9, then 0..13

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
              max_position_embeddings=256, initializer_range=0.1)
ROPE = {"rope_type": "default", "rope_theta": 1e4}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
NO_WINDOW = dict(use_sliding_window=False, sliding_window=None)

# name -> (config class, model class, config kwargs beyond COMMON)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=ROPE, tie_word_embeddings=False)),
    "llama3_rope": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_parameters=ROPE, tie_word_embeddings=False, **NO_WINDOW)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(rope_parameters=ROPE, tie_word_embeddings=True, **NO_WINDOW)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        rope_parameters=ROPE, tie_word_embeddings=False, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        output_router_logits=True, router_aux_loss_coef=0.01, **NO_WINDOW)),
}


# ---------------------------------------------------------------------------- models

def build_model(arch, seed=WEIGHT_SEED, experts="eager", overrides=None):
    """experts: 5.x's MoE experts implementation; "eager" is the loop in the modeling file.
    overrides: config values that replace COMMON's and the architecture's (--set)."""
    config_cls, model_cls, extra = ARCHS[arch]
    config = getattr(transformers, config_cls)(**dict(COMMON, **extra, **(overrides or {})))
    config._attn_implementation = "eager"
    if hasattr(config, "_experts_implementation"):
        config._experts_implementation = experts
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config)
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    assert getattr(model.config, "_experts_implementation", experts) == experts
    perturb_norms_and_biases(model, seed)
    return model.eval()


def perturb_norms_and_biases(model, seed):
    """RMSNorm weights 1 + 0.1*N(0,1), biases 0.1*N(0,1): otherwise exactly 1 and 0, untested."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def is_moe(model):
    return getattr(model.config, "num_experts", 0) > 0 and "Moe" in type(model).__name__


# ---------------------------------------------------------------------------- inputs

def packed_positions():
    row0 = torch.cat([torch.arange(DOC0_LEN), torch.arange(SEQ - DOC0_LEN)])
    return torch.stack([row0, torch.arange(SEQ)])


def block_causal_mask(positions, dtype):
    """Additive [B, 1, T, T] mask: 0 where a token may attend (causal, same document), else min."""
    doc = positions.eq(0).cumsum(1)
    causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    allowed = causal & doc[:, :, None].eq(doc[:, None, :])
    mask = torch.zeros(BATCH, 1, SEQ, SEQ, dtype=dtype)
    return mask.masked_fill(~allowed[:, None], torch.finfo(dtype).min)


def make_cases(seed=INPUT_SEED, dtype=torch.float32):
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))
    pad_ids = ids.clone()
    pad_ids[1] = torch.cat([torch.zeros(PADS, dtype=torch.long), ids[1, :SEQ - PADS]])
    pad_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    pad_mask[1, :PADS] = 0
    pad_positions = (pad_mask.cumsum(1) - 1).masked_fill(pad_mask == 0, 1)
    packed = packed_positions()
    return {
        1: dict(input_ids=ids, labels=ids.clone()),
        2: dict(input_ids=pad_ids, attention_mask=pad_mask, position_ids=pad_positions,
                labels=pad_ids.masked_fill(pad_mask == 0, -100)),
        3: dict(input_ids=ids, position_ids=packed, labels=ids.clone()),
        4: dict(input_ids=ids, position_ids=packed, labels=ids.clone(), attention_mask=block_causal_mask(packed, dtype)),
    }


# ---------------------------------------------------------------------------- running HF

def forward(model, case, n, **overrides):
    kwargs = dict(case, use_cache=False)
    if is_moe(model):
        kwargs["output_router_logits"] = n != 4  # HF's aux loss accepts 2-D masks only
    kwargs.update(overrides)
    return model(**kwargs)


def lm_loss(model, logits, labels):
    """The cross-entropy part alone, through the model's own loss function."""
    return model.loss_function(logits=logits, labels=labels, vocab_size=model.config.vocab_size)


def grad_names(model):
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"]
    if is_moe(model):
        names += ["model.layers.1.mlp.experts.0.down_proj.weight", "model.layers.1.mlp.gate.weight"]
    else:
        names.append("model.layers.1.mlp.down_proj.weight")
    params = dict(model.named_parameters())
    if "lm_head.weight" in params:
        names.append("lm_head.weight")
    if "model.layers.0.self_attn.q_proj.bias" in params:
        names.append("model.layers.0.self_attn.q_proj.bias")
    if "model.layers.0.self_attn.q_norm.weight" in params and not is_moe(model):  # as the 4.51 set: qwen3 only
        names.append("model.layers.0.self_attn.q_norm.weight")
    return names


def param_grad(model, name):
    """A parameter's gradient by its checkpoint name (5.x keeps experts fused: experts.down_proj[e])."""
    params = dict(model.named_parameters())
    if name in params:
        return params[name].grad
    experts, index, leaf, _ = name.rsplit(".", 3)  # model.layers.1.mlp.experts | 0 | down_proj | weight
    return params[f"{experts}.{leaf}"].grad[int(index)]


def run_golden(model, case3_use_cache=False):
    """Every golden tensor of the recipe, as a dict name -> tensor (contiguous, detached).
    case3_use_cache: run case 3 with a KV cache, which turns 5.x's packed-sequence inference off."""
    golden = {}
    for n, case in make_cases(dtype=next(model.parameters()).dtype).items():
        s = f"_case{n}"
        for key, value in case.items():
            golden[key + s] = value
        model.zero_grad(set_to_none=True)
        out = forward(model, case, n, use_cache=case3_use_cache and n == 3)
        golden["logits" + s] = out.logits.detach()
        golden["loss" + s] = out.loss.detach().reshape(1)
        golden["lm_loss" + s] = lm_loss(model, out.logits, case["labels"]).detach().reshape(1)
        if is_moe(model) and n != 4:
            golden["aux_loss" + s] = out.aux_loss.detach().reshape(1)
        if n == 1:
            if is_moe(model):
                for layer, logits in enumerate(out.router_logits):
                    golden[f"router_logits_case1.layer{layer}"] = logits.detach()
            out.loss.backward()
            for name in grad_names(model):
                golden["grad." + name] = param_grad(model, name).detach().clone()
    return {k: v.detach().clone().contiguous() for k, v in golden.items()}


# ---------------------------------------------------------------------------- checks

def max_abs(a, b):
    return float((a.double() - b.double()).abs().max())


def routing_margin(router_logits):
    probs = torch.cat(router_logits).softmax(-1).sort(-1, descending=True).values
    return float((probs[:, 1] - probs[:, 2]).min())


def ce64(logits, labels):
    """Mean next-token cross-entropy over labels != -100, in float64."""
    logits, labels = logits[:, :-1].double().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
    return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)


def fp64_diffs(model, golden):
    """The same HF code in float64 (eager softmax still runs in fp32, as HF writes it)."""
    model64 = copy.deepcopy(model).double()
    g64 = run_golden(model64)
    out = {}
    for n in (1, 3, 4):
        out[f"logits_case{n}"] = max_abs(golden[f"logits_case{n}"], g64[f"logits_case{n}"])
        # HF's loss casts logits to fp32; the fp64 reference is a cross-entropy in fp64.
        out[f"lm_loss_case{n}"] = max_abs(golden[f"lm_loss_case{n}"], ce64(g64[f"logits_case{n}"], golden[f"labels_case{n}"]))
    # Pad query rows are all-masked: fp64 gives NaN there, which spreads to row 1; row 0 only.
    out["logits_case2_row0"] = max_abs(golden["logits_case2"][0], g64["logits_case2"][0])
    out["grads"] = max(max_abs(golden[k], g64[k]) for k in golden if k.startswith("grad."))
    return out


def case3_variants(model, golden):
    """What case 3 (packed position_ids, no mask) gives under the ways a caller may run it."""
    case = make_cases()[3]
    ones = torch.ones(BATCH, SEQ, dtype=torch.long)
    with torch.no_grad():
        with_2d_mask = forward(model, case, 3, attention_mask=ones).logits
        with_cache = forward(model, case, 3, use_cache=True).logits
    causal_ref = golden["logits_case1"]  # same ids, positions differ only in document 2 of row 0
    doc_ref = golden["logits_case4"]
    return {
        "no_mask_use_cache_false_vs_case4": max_abs(golden["logits_case3"], doc_ref),
        "no_mask_use_cache_false_vs_causal_2d_ones": max_abs(golden["logits_case3"], with_2d_mask),
        "no_mask_use_cache_true_vs_causal_2d_ones": max_abs(with_cache, with_2d_mask),
        "no_mask_use_cache_true_vs_case4": max_abs(with_cache, doc_ref),
        "causal_2d_ones_row1_vs_case1_row1": max_abs(with_2d_mask[1], causal_ref[1]),
    }


def case3_attention(variants):
    """'document' when case 3 (as recorded) equals the block-diagonal case 4, 'causal' when it
    equals a 2-D all-ones mask; anything else is a new behaviour to look at, not to record."""
    if variants["no_mask_use_cache_false_vs_case4"] < 1e-6:
        return "document"
    if variants["no_mask_use_cache_false_vs_causal_2d_ones"] < 1e-6:
        return "causal"
    raise RuntimeError(f"case 3 is neither document-masked nor causal: {variants}")


def cross_case(golden):
    g = golden
    return {
        "case2_row1_tail_vs_case1_row1_head": max_abs(g["logits_case2"][1, PADS:], g["logits_case1"][1, :SEQ - PADS]),
        "case2_row0_vs_case1_row0": max_abs(g["logits_case2"][0], g["logits_case1"][0]),
        "case3_row1_vs_case1_row1": max_abs(g["logits_case3"][1], g["logits_case1"][1]),
        "case4_row0_doc1_vs_case1_row0": max_abs(g["logits_case4"][0, :DOC0_LEN], g["logits_case1"][0, :DOC0_LEN]),
        "case4_doc2_vs_case1_row0_tail (mask effect)": max_abs(g["logits_case4"][0, DOC0_LEN:], g["logits_case1"][0, DOC0_LEN:]),
    }


def moe_checks(arch, model, golden):
    out = forward(model, make_cases()[1], 1)
    coef = model.config.router_aux_loss_coef
    checks = {
        "loss_minus_lm_plus_coef_aux": float((golden["loss_case1"] - golden["lm_loss_case1"] - coef * golden["aux_loss_case1"]).abs()),
        "routing_margin_top2_top3": routing_margin([r.detach() for r in out.router_logits]),
    }
    try:  # 5.x's default experts implementation (torch._grouped_mm) against the eager loop
        grouped = run_golden(build_model(arch, experts="grouped_mm"))
        checks["grouped_mm_experts_vs_eager"] = {k: max_abs(grouped[k], golden[k]) for k in sorted(golden)
                                                 if k.startswith(("logits", "loss", "grad."))}
    except (ValueError, ImportError, RuntimeError) as e:
        checks["grouped_mm_experts_vs_eager"] = f"not available: {e}"
    return checks


def identical(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def load_folder(folder):
    kwargs = dict(attn_implementation="eager")
    config = transformers.AutoConfig.from_pretrained(folder)
    if getattr(config, "num_experts", 0):
        kwargs["experts_implementation"] = "eager"
    return transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs).eval()


def round_trip(folder, golden):
    model = load_folder(folder)
    with torch.no_grad():
        logits = forward(model, make_cases()[1], 1).logits
    return max_abs(logits, golden["logits_case1"])


# ---------------------------------------------------------------------------- writing

def provenance(arch):
    return {
        "arch": arch, "format": "pt", "weight_seed": str(WEIGHT_SEED), "input_seed": str(INPUT_SEED),
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "safetensors_version": safetensors.__version__,
    }


def make_arch(arch, out_dir):
    folder = os.path.join(out_dir, arch)
    model = build_model(arch)
    golden = run_golden(model)
    variants = case3_variants(model, golden)
    meta = dict(provenance(arch), case3_attention=case3_attention(variants))
    model.save_pretrained(folder)
    save_file(golden, os.path.join(folder, "golden.safetensors"), metadata=meta)

    torch.set_num_threads(2)
    two_threads = run_golden(build_model(arch))
    torch.set_num_threads(1)
    stats = {
        "case3_attention": meta["case3_attention"],
        "logits_abs_max": max(float(golden[f"logits_case{n}"].abs().max()) for n in (1, 3, 4)),
        "losses": {k: float(v) for k, v in golden.items() if "loss" in k},
        "second_run_identical": identical(golden, run_golden(build_model(arch))),
        "two_threads_identical": identical(golden, two_threads),
        "two_threads_max_abs": max(max_abs(golden[k], two_threads[k]) for k in golden if golden[k].is_floating_point()),
        "fp32_vs_fp64": fp64_diffs(model, golden),
        "cross_case": cross_case(golden),
        "case3_variants": variants,
        "from_pretrained_logits_case1_diff": round_trip(folder, golden),
    }
    if is_moe(model):
        stats["moe"] = moe_checks(arch, model, golden)
    return stats


def compare_sets(out_dir, other_dir):
    """Per architecture, max |a - b| between this set and another of the same recipe."""
    result = {}
    for arch in sorted(ARCHS):
        a_dir, b_dir = os.path.join(out_dir, arch), os.path.join(other_dir, arch)
        if not os.path.isdir(b_dir):
            continue
        wa, wb = load_file(f"{a_dir}/model.safetensors"), load_file(f"{b_dir}/model.safetensors")
        ga, gb = load_file(f"{a_dir}/golden.safetensors"), load_file(f"{b_dir}/golden.safetensors")
        with safe_open(f"{b_dir}/golden.safetensors", "pt") as f:
            other_meta = f.metadata() or {}
        ca, cb = (json.load(open(f"{d}/config.json")) for d in (a_dir, b_dir))
        shared_w = sorted(set(wa) & set(wb))
        # The other set's weights through this transformers: its case 3 as it was recorded.
        replay = run_golden(load_folder(b_dir), case3_use_cache=other_meta.get("case3_attention", "causal") == "causal")
        result[arch] = {
            "other_versions": {k: other_meta.get(k) for k in ("transformers_version", "torch_version")},
            "weights_only_here": sorted(set(wa) - set(wb)), "weights_only_there": sorted(set(wb) - set(wa)),
            "weights_max_abs": max(max_abs(wa[k], wb[k]) for k in shared_w),
            "weights_differing": [k for k in shared_w if not torch.equal(wa[k], wb[k])],
            "inputs_identical": all(torch.equal(ga[k], gb[k]) for k in ga if k.split("_case")[0] in
                                    ("input_ids", "labels", "attention_mask", "position_ids")),
            "golden_only_here": sorted(set(ga) - set(gb)), "golden_only_there": sorted(set(gb) - set(ga)),
            "golden_max_abs": {k: max_abs(ga[k], gb[k]) for k in sorted(set(ga) & set(gb))
                               if ga[k].is_floating_point() and k.split("_case")[0] not in ("attention_mask",)},
            "replay_other_weights_max_abs": {k: max_abs(replay[k], gb[k]) for k in sorted(set(replay) & set(gb))
                                             if gb[k].is_floating_point() and not k.startswith("attention_mask")},
            "config_keys_only_here": sorted(set(ca) - set(cb)), "config_keys_only_there": sorted(set(cb) - set(ca)),
        }
    return result


def write_model_only(args):
    """One architecture's folder as save_pretrained writes it, plus a tokenizer: a benchmark's model."""
    import shutil
    archs = args.archs.split(",")
    if len(archs) != 1 or archs[0] not in ARCHS:
        sys.exit(f"--model-only: give one architecture with --archs, one of {', '.join(ARCHS)}")
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"--set {item}: expected KEY=VALUE")
        overrides[key] = json.loads(value)
    torch.set_num_threads(os.cpu_count() or 1)
    transformers.utils.logging.set_verbosity_error()
    model = build_model(archs[0], overrides=overrides)
    model.save_pretrained(args.out)
    if args.tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
            if os.path.exists(os.path.join(args.tokenizer, name)):
                shutil.copy(os.path.join(args.tokenizer, name), args.out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.out}: {type(model).__name__}, {params / 1e6:.1f} M parameters, vocabulary {model.config.vocab_size}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (one subfolder per architecture)")
    parser.add_argument("--archs", default=",".join(ARCHS), help="comma-separated subset of " + ",".join(ARCHS))
    parser.add_argument("--compare", help="another fixture set to measure against (e.g. tests/fixtures/hf)")
    parser.add_argument("--model-only", action="store_true", help="write only the model folder of one architecture at --out")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="with --model-only: config values (JSON values)")
    parser.add_argument("--tokenizer", help="with --model-only: a folder whose tokenizer files are copied into the model folder")
    args = parser.parse_args()
    if args.model_only:
        write_model_only(args)
        return

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    os.makedirs(args.out, exist_ok=True)
    summary = {
        "provenance": dict(provenance("*"), python=platform.python_version(), command=" ".join(sys.argv),
                           device="cpu", dtype="float32", attn_implementation="eager", threads=1,
                           deterministic=True),
        "architectures": {},
    }
    for arch in args.archs.split(","):
        print(f"{arch} ...", flush=True)
        summary["architectures"][arch] = make_arch(arch, args.out)
    if args.compare:
        summary["compare"] = {"other": args.compare, "architectures": compare_sets(args.out, args.compare)}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps({a: {k: v for k, v in s.items() if k in ("case3_attention", "fp32_vs_fp64", "second_run_identical")}
                      for a, s in summary["architectures"].items()}, indent=1))


if __name__ == "__main__":
    main()
