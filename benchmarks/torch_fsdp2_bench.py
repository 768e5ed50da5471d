"""PyTorch's own FSDP2 (`torch.distributed.fsdp.fully_shard`, Gloo on CPU) on the model of
benchmarks/fsdp_bench.cpp: one `fully_shard` per block and one for the root, as torchtitan
applies it. Run through a launcher that sets the env:// variables (ours or torchrun), e.g.
  build/hyperparallel run --nproc-per-node 2 -- PYTHON benchmarks/torch_fsdp2_bench.py bench fsdp2 6

  bench MODE STEPS   MODE fsdp2 (reshard_after_forward=True), fsdp2_keep (False), or
                     torch_local: every rank the whole unsharded model, no communication in
                     the step (PyTorch's compute floor at the same threads, fsdp_bench's
                     `local` twin); the 24.9 M model and per-rank batch of fsdp_bench, each
                     rank its own rows (generator 100 + rank). Prints, on rank 0:
                     RESULT mode=... ranks=... step_ms=<median> rss_mb=<max over ranks>
  trajectory --weights FILE --dims V,D,H,L --seq S --batch B --steps N --lr LR [--keep] [--out FILE]
                     trains from the weights in FILE (ToyLM's names) on global batches drawn
                     from generator 77 + step, each rank its equal share of the rows, with
                     AdamW(lr, weight_decay 0.01); prints `LOSS step value` per step (the mean
                     over ranks) and writes the trained full parameters to --out (rank 0).
                     tests/unit/fsdp_torch_peer_test.cpp compares that with ours.
"""
import argparse
import sys
import time

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from torch_peer_lm import ToyLM, init_process_group, next_token_loss, peak_rss_mb_max_over_ranks, rows_of_rank

BENCH_DIMS = (8192, 640, 2560, 6)
BENCH_SEQ, BENCH_BATCH = 64, 4


def shard(model, world, keep):
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=not keep)
    fully_shard(model, mesh=mesh, reshard_after_forward=not keep)


def bench(mode, steps):
    rank, world = init_process_group()
    torch.manual_seed(0)
    vocab = BENCH_DIMS[0]
    model = ToyLM(*BENCH_DIMS)
    if mode not in ("fsdp2", "fsdp2_keep", "torch_local"):
        sys.exit(f"unknown mode {mode}: fsdp2, fsdp2_keep or torch_local")
    if mode != "torch_local":
        shard(model, world, keep=mode == "fsdp2_keep")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(100 + rank)
    times = []
    for step in range(steps + 2):
        seq = torch.randint(0, vocab, (BENCH_BATCH, BENCH_SEQ + 1), generator=gen)
        dist.barrier()
        t0 = time.perf_counter()
        loss = next_token_loss(model, seq, vocab)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= 2:
            times.append(time.perf_counter() - t0)
    times.sort()
    rss = peak_rss_mb_max_over_ranks()
    if rank == 0:
        print(f"RESULT mode={mode} ranks={world} step_ms={times[len(times) // 2] * 1e3:.1f} rss_mb={rss:.0f}", flush=True)


def trajectory(args):
    rank, world = init_process_group()
    vocab, dim, hidden, layers = (int(x) for x in args.dims.split(","))
    model = ToyLM(vocab, dim, hidden, layers)
    model.load_state_dict(load_file(args.weights), strict=True)
    shard(model, world, keep=args.keep)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, foreach=False)
    for step in range(args.steps):
        gen = torch.Generator().manual_seed(77 + step)
        seq = rows_of_rank(torch.randint(0, vocab, (args.batch, args.seq + 1), generator=gen), rank, world)
        loss = next_token_loss(model, seq, vocab)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print(f"LOSS {step} {mean.item() / world:.9e}", flush=True)
    full = {name: p.full_tensor().contiguous() for name, p in model.state_dict().items()}
    if rank == 0 and args.out:
        save_file(full, args.out)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "bench":
        bench(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 6)
    else:
        parser = argparse.ArgumentParser()
        parser.add_argument("command", choices=["trajectory"])
        parser.add_argument("--weights", required=True)
        parser.add_argument("--dims", required=True)
        parser.add_argument("--seq", type=int, required=True)
        parser.add_argument("--batch", type=int, required=True)
        parser.add_argument("--steps", type=int, required=True)
        parser.add_argument("--lr", type=float, required=True)
        parser.add_argument("--keep", action="store_true")
        parser.add_argument("--out", default="")
        trajectory(parser.parse_args())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
