"""PyTorch's own tensor parallelism (Gloo on CPU) on the model of benchmarks/tp_bench.cpp: the
~48 M Qwen3 of bench_qwen3.h (vocab 32768, hidden 512, 10 layers, 8 heads of 64, 4 kv heads,
intermediate 1536, tied embeddings, rms_norm_eps 1e-6, rope_theta 10000: our qwen3-debug
flavour's) as transformers' Qwen3ForCausalLM in fp32, one global batch of 8 x 256 tokens per step
on every TP rank (ids from generator 100 + step, labels = ids, HF's shifted mean loss), AdamW
lr 1e-4; step 0 is a warm-up, then STEPS steps each timed after a barrier. Run through a launcher
that sets the env:// variables (ours or torchrun):
  build/hyperparallel run --no-prefix --nproc-per-node 4 -- PYTHON benchmarks/torch_tp_bench.py MODE STEPS

  hf_tp_auto     transformers' own TP: rank 0 has a child process save random weights with
                 save_pretrained into a temporary folder (removed at the end), every rank
                 loads them with from_pretrained(distributed_config=DistributedConfig(tp_plan="auto")),
                 the spelling 5.25 wants for the deprecated from_pretrained(tp_plan="auto"). It applies
                 the model's base_model_tp_plan, which has no sequence parallelism (5.25's
                 DistributedConfig.enable_sequence_parallel is "not wired up yet"): the embedding is
                 vocab-parallel with an all-reduced output, q/k/v/gate/up colwise, o/down rowwise with
                 an all-reduced output, q_norm/k_norm replicated with all-reduced gradients, the other
                 norms plain replicated tensors, the head colwise with its logits all-gathered; the
                 loss is HF's on the gathered logits.
  dtensor_tp_sp  torch.distributed.tensor.parallel on the same HF model with torchtitan's Llama plan
                 in HF's names (sequence + loss parallel; see parallelize()).
  dtensor_tp     the same plan without sequence parallelism (the residual stream replicated,
                 row-parallel outputs all-reduced), still loss parallel.

Prints, on rank 0:  RESULT mode=MODE ranks=N step_ms=<median> rss_mb=<max peak RSS over ranks> attn=...
Options: --tiny (vocab 512, hidden 64, 2 layers, 8 heads of 8, 4 kv heads, 4 x 32 tokens) or
--vocab/--hidden/--layers/--heads/--kv-heads/--head-dim/--intermediate/--rows/--seq;
--attn sdpa|eager (default sdpa); --check: before the timed run, train the same weights on one
process (every rank, unsharded) for two steps and compare the first step's loss, every gathered
gradient of the first step and the second step's loss (after AdamW) with the TP run's; prints
CHECK ... and fails (exit 1) when the first loss or a gradient differs by more than 1e-5 relative.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from torch_peer_lm import init_process_group, peak_rss_mb_max_over_ranks

MODES = ("hf_tp_auto", "dtensor_tp_sp", "dtensor_tp")
BENCH = dict(vocab=32768, hidden=512, layers=10, heads=8, kv_heads=4, head_dim=64, intermediate=1536, rows=8, seq=256)
TINY = dict(vocab=512, hidden=64, layers=2, heads=8, kv_heads=4, head_dim=8, intermediate=128, rows=4, seq=32)
TOLERANCE = 1e-5  # fp32, relative (ARCHITECTURE.md "Habits")


def qwen3_config(d, attn):
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["intermediate"],
        num_hidden_layers=d["layers"], num_attention_heads=d["heads"], num_key_value_heads=d["kv_heads"],
        head_dim=d["head_dim"], max_position_embeddings=max(1024, d["seq"]), rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
        attention_bias=False, initializer_range=0.02, pad_token_id=None, bos_token_id=None, eos_token_id=None,
        use_cache=False, dtype="float32")
    config._attn_implementation = attn
    return config


def random_model(config):
    """The same random weights on every rank and in the one-process reference."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight, "expected tied embeddings"
    return model


def parallelize(model, mesh, sequence_parallel):
    """torchtitan's Llama plan in HF Qwen3's names. The residual stream between blocks is
    Shard(1) (sequence) with SP, else replicated. The tied embedding and head share one weight
    sharded on the vocabulary (dim 0) for both uses: the embedding vocab-parallel (RowwiseParallel,
    its partial lookups reduce-scattered to the sequence shards), the head ColwiseParallel with its
    logits kept vocab-sharded for loss_parallel(). Both styles want Shard(0) of the same [vocab,
    hidden] tensor, so the tie survives sharding with no extra traffic; parallelize_module makes a
    new parameter per module, so the head is re-tied to the embedding's afterwards and the one
    gradient sums both uses. Qwen3's q_norm/k_norm act per head on this rank's heads: q/k stay
    DTensors (Shard on the flattened heads, viewed to Shard(2)) into SequenceParallel(2), so the
    norm weights are replicated and their gradients summed over tp (torchtitan's Qwen3 plan)."""
    stream = Shard(1) if sequence_parallel else Replicate()
    top = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=stream),
        "lm_head": ColwiseParallel(input_layouts=stream, output_layouts=Shard(-1), use_local_output=False),
    }
    if sequence_parallel:
        top["model.norm"] = SequenceParallel(use_local_output=True)
    parallelize_module(model, mesh, top)
    for layer in model.model.layers:
        plan = {
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": stream},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "self_attn.q_proj": ColwiseParallel(use_local_output=False),
            "self_attn.k_proj": ColwiseParallel(use_local_output=False),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
            "self_attn.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
            "self_attn.o_proj": RowwiseParallel(output_layouts=stream),
            "mlp": PrepareModuleInput(input_layouts=(stream,), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=stream),
        }
        if sequence_parallel:
            plan["input_layernorm"] = SequenceParallel()
            plan["post_attention_layernorm"] = SequenceParallel()
        parallelize_module(layer, mesh, plan)
    model.lm_head.weight = model.model.embed_tokens.weight


def hf_tp_auto_model(config, folder):
    from transformers import Qwen3ForCausalLM
    from transformers.distributed import DistributedConfig

    model = Qwen3ForCausalLM.from_pretrained(folder, distributed_config=DistributedConfig(tp_plan="auto"),
                                             dtype=torch.float32, attn_implementation=config._attn_implementation)
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        raise RuntimeError("transformers' tp_plan='auto' untied the embedding and the head")
    return model


def optimizer(model):
    """AdamW with torch's defaults (ours: lr 1e-4, weight decay 0.01). DTensor and plain
    parameters in separate groups: a foreach step cannot mix them in one list."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [g for g in ([p for p in params if isinstance(p, DTensor)],
                          [p for p in params if not isinstance(p, DTensor)]) if g]
    return torch.optim.AdamW([{"params": g} for g in groups], lr=1e-4)


def batch(step, d):
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randint(d["vocab"], (d["rows"], d["seq"]), generator=gen)


def full_sequence_kwargs(config, ids):
    """What the plain model derives from its input's length, for the whole sequence: with SP
    the embedding's output holds 1/tp of it, and HF would build positions and the causal mask
    from that. The mask is create_causal_mask's for the full length (None for sdpa: is_causal)."""
    from transformers.masking_utils import create_causal_mask

    rows, seq = ids.shape
    position_ids = torch.arange(seq).unsqueeze(0)
    mask = create_causal_mask(config=config, inputs_embeds=torch.empty(rows, seq, 1), attention_mask=None,
                              cache=None, position_ids=position_ids)
    return {"position_ids": position_ids, "attention_mask": {"full_attention": mask}}


class Trainer:
    def __init__(self, model, mode):
        self.model, self.mode = model, mode
        self.opt = optimizer(model)

    def forward_backward(self, ids):
        """One step's forward and backward; returns the loss as a plain scalar tensor."""
        if self.mode == "hf_tp_auto" or self.mode == "reference":
            loss = self.model(input_ids=ids, labels=ids).loss
            self.opt.zero_grad()
            loss.backward()
        else:
            with loss_parallel():
                loss = self.model(input_ids=ids, labels=ids, **full_sequence_kwargs(self.model.config, ids)).loss
                self.opt.zero_grad()
                loss.backward()
        loss = loss.detach()
        return loss.full_tensor() if isinstance(loss, DTensor) else loss

    def step(self, ids):
        loss = self.forward_backward(ids)
        self.opt.step()
        return loss


def full_grads(model):
    """Every parameter's gradient, gathered (collective: the same order on every rank)."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        out[name] = g.full_tensor() if isinstance(g, DTensor) else g.clone()
    return out


def check(trainer, reference, d, mode, world):
    """Two steps of the TP run against two of the one-process reference on the same weights."""
    ref0 = reference.forward_backward(batch(0, d))
    ref_grads = full_grads(reference.model)
    reference.opt.step()
    ref1 = reference.step(batch(1, d))
    loss0 = trainer.forward_backward(batch(0, d))
    grads = full_grads(trainer.model)
    trainer.opt.step()
    loss1 = trainer.step(batch(1, d))
    if grads.keys() != ref_grads.keys():
        raise RuntimeError(f"parameters differ from the reference's: {sorted(grads.keys() ^ ref_grads.keys())}")
    worst, worst_name = 0.0, ""
    for name, g in grads.items():
        r = ref_grads[name]
        rel = ((g - r).norm() / r.norm().clamp_min(1e-30)).item()
        if rel > worst:
            worst, worst_name = rel, name
    rel0 = abs(loss0.item() - ref0.item()) / abs(ref0.item())
    rel1 = abs(loss1.item() - ref1.item()) / abs(ref1.item())
    ok = rel0 <= TOLERANCE and worst <= TOLERANCE
    if dist.get_rank() == 0:
        print(f"CHECK mode={mode} ranks={world} loss0={loss0.item():.8f} ref0={ref0.item():.8f} rel0={rel0:.2e} "
              f"grad_rel_max={worst:.2e} ({worst_name}) loss1={loss1.item():.8f} ref1={ref1.item():.8f} "
              f"rel1={rel1:.2e} tolerance={TOLERANCE:.0e} {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=MODES)
    p.add_argument("steps", type=int)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--check", action="store_true")
    p.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa")
    for key in BENCH:
        p.add_argument("--" + key.replace("_", "-"), type=int, dest=key)
    args = p.parse_args(argv)
    dims = dict(TINY if args.tiny else BENCH)
    dims.update({k: getattr(args, k) for k in BENCH if getattr(args, k) is not None})
    return args, dims


def main(argv):
    args, d = parse_args(argv)
    rank, world = init_process_group()
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for need, what in ((d["heads"], "--heads"), (d["kv_heads"], "--kv-heads"), (d["seq"], "--seq")):
        if need % world:
            raise SystemExit(f"{what} {need} must divide by the {world} ranks")
    config = qwen3_config(d, args.attn)
    folder = None
    if args.mode == "hf_tp_auto":
        folder = [tempfile.mkdtemp(prefix="torch_tp_bench_") if rank == 0 else None]
        dist.broadcast_object_list(folder, src=0)
        folder = folder[0]
        if rank == 0:  # in a child process, so that the whole model stays out of rank 0's peak RSS
            subprocess.run([sys.executable, os.path.abspath(__file__), "--write-folder", folder, args.attn,
                            json.dumps(d)], check=True)
        dist.barrier()
    try:
        reference = None
        if args.check:
            if args.mode == "hf_tp_auto":
                from transformers import Qwen3ForCausalLM

                ref_model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=args.attn)
            else:
                ref_model = random_model(config)
            reference = Trainer(ref_model, "reference")
        if args.mode == "hf_tp_auto":
            model = hf_tp_auto_model(config, folder)
        else:
            model = random_model(config)
            parallelize(model, init_device_mesh("cpu", (world,)), sequence_parallel=args.mode == "dtensor_tp_sp")
        trainer = Trainer(model, args.mode)
        ok = True
        if reference is not None:
            ok = check(trainer, reference, d, args.mode, world)
            del reference
        times = []
        for step in range(args.steps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            trainer.step(batch(step, d))
            if step > 0:
                times.append(time.perf_counter() - t0)
        rss = peak_rss_mb_max_over_ranks()
        if rank == 0 and times:
            print(f"RESULT mode={args.mode} ranks={world} step_ms={statistics.median(times) * 1e3:.1f} "
                  f"rss_mb={rss:.0f} attn={args.attn}", flush=True)
        dist.barrier()
    finally:
        if folder is not None and rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-folder"]:  # hf_tp_auto's rank 0: FOLDER ATTN DIMS_JSON
        import transformers

        transformers.utils.logging.disable_progress_bar()
        random_model(qwen3_config(json.loads(sys.argv[4]), sys.argv[3])).save_pretrained(sys.argv[2])
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
