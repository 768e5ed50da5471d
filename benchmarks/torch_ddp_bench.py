"""PyTorch DDP (Gloo) on the model and per-rank batch of benchmarks/fsdp_bench.cpp. Run through
a launcher that sets the env:// variables (ours or torchrun), e.g.
  build/hyperparallel run --nproc-per-node 2 -- PYTHON benchmarks/torch_ddp_bench.py 6
Prints, on rank 0: RESULT mode=torch_ddp ranks=... step_ms=<median> rss_mb=<max over ranks>
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from torch_fsdp2_bench import BENCH_BATCH, BENCH_DIMS, BENCH_SEQ
from torch_peer_lm import ToyLM, init_process_group, next_token_loss, peak_rss_mb_max_over_ranks


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    rank, world = init_process_group()
    torch.manual_seed(0)
    vocab = BENCH_DIMS[0]
    model = nn.parallel.DistributedDataParallel(ToyLM(*BENCH_DIMS))
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
        print(f"RESULT mode=torch_ddp ranks={world} step_ms={times[len(times) // 2] * 1e3:.1f} rss_mb={rss:.0f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
