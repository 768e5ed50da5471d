"""PyTorch's own pipeline schedules (torch.distributed.pipelining, Gloo on CPU) on the model of
benchmarks/pp_bench.cpp: a 16-layer Llama (our llama-debug flavour resized: vocab 8192, hidden
256, intermediate 768, 8 heads of 32, 4 kv heads, untied head, rms_norm_eps 1e-6, rope_theta
10000) as transformers' LlamaForCausalLM in fp32, trained on PP_BENCH_MICROBATCHES (default 8)
micro-batches of 2 rows x 256 tokens per step (micro-batch m of step s from generator
1000 * s + m, labels = ids), loss = cross entropy mean over the step's tokens (each micro-batch's
mean, the gradients scaled by 1 / micro-batches: the same value), AdamW lr 1e-4; step 0 is a
warm-up, then STEPS steps each timed after a barrier. Run through a launcher that sets the env://
variables (ours or torchrun):
  build/hyperparallel run --no-prefix --nproc-per-node 4 -- PYTHON benchmarks/torch_pp_bench.py MODE STEPS

  gpipe        ScheduleGPipe, one stage per rank
  1f1b         Schedule1F1B, one stage per rank
  interleaved  ScheduleInterleaved1F1B, 2 virtual stages per rank (stage s on rank s % ranks)

The stages are built by hand, as torchtitan does: every rank builds the whole model from the same
seed and keeps its stages' pieces (stage_modules()), split like our pp::balanced_split, which
counts the embedding and the head as one layer each (16 layers on 4 stages: embedding + 3 | 5 |
5 | 3 + head; on 8: embedding + 1 | 3 | 3 | 2 | 2 | 2 | 2 | 1 + head). Prints, on rank 0:
  RESULT mode=torch_MODE ranks=N step_ms=<median> rss_mb=<max peak RSS over ranks> microbatches=M attn=...
Options: --tiny (vocab 512, hidden 64, 2 layers, 4 heads of 16, 2 kv heads, 2 x 32 tokens per
micro-batch) or --vocab/--hidden/--layers/--heads/--kv-heads/--head-dim/--intermediate/--rows/--seq;
--attn sdpa|eager (default sdpa); --check: before the timed run, train the same weights on one
process (every rank, unsharded, the whole batch at once) for two steps and compare the first
step's loss, every gradient of the first step (each rank its own stages' parameters) and the
second step's loss with the pipeline's; prints CHECK ... and fails (exit 1) when the first loss or
a gradient differs by more than 1e-5 relative.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from torch_peer_lm import init_process_group, peak_rss_mb_max_over_ranks

MODES = ("gpipe", "1f1b", "interleaved")
BENCH = dict(vocab=8192, hidden=256, layers=16, heads=8, kv_heads=4, head_dim=32, intermediate=768, rows=2, seq=256)
TINY = dict(vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, rows=2, seq=32)
TOLERANCE = 1e-5  # fp32, relative (ARCHITECTURE.md "Habits")


def llama_config(d, attn):
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["intermediate"],
        num_hidden_layers=d["layers"], num_attention_heads=d["heads"], num_key_value_heads=d["kv_heads"],
        head_dim=d["head_dim"], max_position_embeddings=max(1024, d["seq"]), rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, initializer_range=0.02, pad_token_id=None, bos_token_id=None,
        eos_token_id=None, use_cache=False, dtype="float32")
    config._attn_implementation = attn
    return config


def random_model(config):
    """The same random weights on every rank and in the one-process reference."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def balanced_split(layers, stages):
    """pp::balanced_split (src/pp/stage_split.cpp): layers + 2 pieces (the embedding and the head
    count as one each), base = pieces // stages per stage, the remainder one each to the middle
    stages first, then the first, then the last. Returns each stage's [begin, end) decoder layers."""
    if stages < 1 or layers + 2 < stages:
        raise SystemExit(f"{stages} stages cannot split {layers} layers (each stage needs a layer, the first and last "
                         f"may hold just the embedding or the head): pass --layers {stages - 2} or more")
    pieces = layers + 2
    size = [pieces // stages] * stages
    order = list(range(1, stages - 1)) + [0] + ([stages - 1] if stages > 1 else [])
    for k in range(pieces % stages):
        size[order[k]] += 1
    size[0] -= 1
    size[-1] -= 1
    spans, begin = [], 0
    for n in size:
        spans.append((begin, begin + n))
        begin += n
    return spans


class Stage(nn.Module):
    """One pipeline stage of an HF causal LM: the embedding (first stage), a run of decoder layers,
    the final norm and head (last stage). It computes positions, rotary embeddings and the causal
    mask from its input's sequence length, as LlamaModel.forward does for the whole model."""

    def __init__(self, lm, begin, end, first, last):
        super().__init__()
        self.config = lm.config
        self.embed_tokens = lm.model.embed_tokens if first else None
        self.layers = nn.ModuleDict({str(i): lm.model.layers[i] for i in range(begin, end)})
        self.norm = lm.model.norm if last else None
        self.lm_head = lm.lm_head if last else None
        self.rotary_emb = lm.model.rotary_emb  # buffers only (inv_freq)

    def forward(self, x):
        from transformers.masking_utils import create_causal_mask

        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        if len(self.layers):
            position_ids = torch.arange(h.shape[1]).unsqueeze(0)
            mask = create_causal_mask(config=self.config, inputs_embeds=h, attention_mask=None, cache=None,
                                      position_ids=position_ids)
            position_embeddings = self.rotary_emb(h, position_ids)
            for layer in self.layers.values():
                h = layer(h, attention_mask=mask, position_ids=position_ids, position_embeddings=position_embeddings)
        if self.lm_head is not None:
            h = self.lm_head(self.norm(h))
        return h


def stage_modules(lm, rank, world, virtual):
    """This rank's stages (index rank + v * world for v < virtual) with their global indices, and
    a map from each kept parameter to its name in the whole model."""
    n = world * virtual
    spans = balanced_split(lm.config.num_hidden_layers, n)
    names = {id(p): name for name, p in lm.named_parameters()}
    stages = []
    for v in range(virtual):
        s = rank + v * world
        stages.append((s, Stage(lm, *spans[s], first=s == 0, last=s == n - 1)))
    return stages, names, n


def next_token_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def batch(step, microbatches, d):
    """The step's micro-batches, one after another along dim 0 (the schedule splits them back)."""
    return torch.cat([torch.randint(d["vocab"], (d["rows"], d["seq"]),
                                    generator=torch.Generator().manual_seed(1000 * step + m))
                      for m in range(microbatches)])


class Pipeline:
    def __init__(self, mode, stages, num_stages, microbatches, world):
        device = torch.device("cpu")
        self.pipeline_stages = [PipelineStage(module, index, num_stages, device) for index, module in stages]
        self.first = any(index == 0 for index, _ in stages)
        self.last = any(index == num_stages - 1 for index, _ in stages)
        params = [p for _, module in stages for p in module.parameters()]
        self.opt = torch.optim.AdamW(params, lr=1e-4)
        if mode == "interleaved":
            self.schedule = ScheduleInterleaved1F1B(self.pipeline_stages, microbatches, loss_fn=next_token_loss)
        else:
            kind = ScheduleGPipe if mode == "gpipe" else Schedule1F1B
            self.schedule = kind(self.pipeline_stages[0], microbatches, loss_fn=next_token_loss)

    def forward_backward(self, ids):
        """One step's forward and backward; returns the step's mean loss (0 on ranks without the last stage)."""
        self.opt.zero_grad()
        losses = []
        kwargs = {"target": ids, "losses": losses} if self.last else {}
        if self.first:
            self.schedule.step(ids, **kwargs)
        else:
            self.schedule.step(**kwargs)
        return torch.stack(losses).mean().detach() if self.last else torch.zeros(())

    def step(self, ids):
        loss = self.forward_backward(ids)
        self.opt.step()
        return loss


class Reference:
    """The whole model on one process, the whole batch at once."""

    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def forward_backward(self, ids):
        self.opt.zero_grad()
        loss = next_token_loss(self.model(input_ids=ids).logits, ids)
        loss.backward()
        return loss.detach()

    def step(self, ids):
        loss = self.forward_backward(ids)
        self.opt.step()
        return loss


def pipeline_loss(loss):
    """The last stage's loss on every rank."""
    loss = loss.clone().reshape(1)
    dist.all_reduce(loss)
    return loss.item()


def check(pipe, reference, stages, names, microbatches, d, mode, world):
    ref0 = reference.forward_backward(batch(0, microbatches, d)).item()
    ref_grads = {name: p.grad.clone() for name, p in reference.model.named_parameters()}
    reference.opt.step()
    ref1 = reference.step(batch(1, microbatches, d)).item()
    loss0 = pipeline_loss(pipe.forward_backward(batch(0, microbatches, d)))
    worst, worst_name = 0.0, ""
    for _, module in stages:
        for p in module.parameters():
            r = ref_grads[names[id(p)]]
            rel = ((p.grad - r).norm() / r.norm().clamp_min(1e-30)).item()
            if rel > worst:
                worst, worst_name = rel, names[id(p)]
    pipe.opt.step()
    loss1 = pipeline_loss(pipe.step(batch(1, microbatches, d)))
    worst_all = torch.tensor([worst], dtype=torch.float64)
    dist.all_reduce(worst_all, op=dist.ReduceOp.MAX)
    worst_here = worst
    worst = worst_all.item()
    rel0 = abs(loss0 - ref0) / abs(ref0)
    rel1 = abs(loss1 - ref1) / abs(ref1)
    ok = rel0 <= TOLERANCE and worst <= TOLERANCE
    if dist.get_rank() == 0:
        print(f"CHECK mode=torch_{mode} ranks={world} microbatches={microbatches} loss0={loss0:.8f} ref0={ref0:.8f} "
              f"rel0={rel0:.2e} grad_rel_max={worst:.2e} (rank 0's worst: {worst_here:.2e} {worst_name}) "
              f"loss1={loss1:.8f} ref1={ref1:.8f} rel1={rel1:.2e} tolerance={TOLERANCE:.0e} "
              f"{'PASS' if ok else 'FAIL'}", flush=True)
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
    microbatches = int(os.environ.get("PP_BENCH_MICROBATCHES", "8"))
    rank, world = init_process_group()
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    config = llama_config(d, args.attn)
    virtual = 2 if args.mode == "interleaved" else 1
    reference = Reference(random_model(config)) if args.check else None
    lm = random_model(config)
    stages, names, num_stages = stage_modules(lm, rank, world, virtual)
    del lm  # the other stages' pieces go with it
    pipe = Pipeline(args.mode, stages, num_stages, microbatches, world)
    ok = True
    if reference is not None:
        ok = check(pipe, reference, stages, names, microbatches, d, args.mode, world)
        del reference
    times = []
    for step in range(args.steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        pipe.step(batch(step, microbatches, d))
        if step > 0:
            times.append(time.perf_counter() - t0)
    rss = peak_rss_mb_max_over_ranks()
    if rank == 0 and times:
        print(f"RESULT mode=torch_{args.mode} ranks={world} step_ms={statistics.median(times) * 1e3:.1f} "
              f"rss_mb={rss:.0f} microbatches={microbatches} attn={args.attn}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
