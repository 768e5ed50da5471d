"""PyTorch DDP (gloo) on the architecture of benchmarks/fsdp_bench.cpp, same per-rank batch.

Run through the launcher (torch.distributed.run is broken on Debian's Python 3.11):
  build/hyperparallel run --nproc-per-node 2 -- /usr/bin/python3 benchmarks/torch_ddp_bench.py
Prints: RESULT mode=torch_ddp ... step_ms=...
"""
import os
import resource
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

VOCAB, DIM, HIDDEN, LAYERS, SEQ, BATCH = 8192, 640, 2560, 6, 64, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.Parameter(torch.ones(DIM))
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x * self.norm)))


class BenchLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.final_norm = nn.Parameter(torch.ones(DIM))

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.layers:
            h = block(h)
        return (h * self.final_norm) @ self.embed.weight.t()


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    # The launcher's own store already listens on MASTER_PORT (it hands rank 0 the socket), so
    # PyTorch's TCP store cannot bind it: rendezvous through a file named after that port.
    rendezvous = os.path.join(tempfile.gettempdir(), f"hp_torch_ddp_{os.environ['MASTER_PORT']}")
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(BenchLM())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(100 + rank)
    times = []
    for step in range(steps + 2):
        seq = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
        dist.barrier()
        t0 = time.perf_counter()
        logits = model(seq[:, :SEQ])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= 2:
            times.append(time.perf_counter() - t0)
    times.sort()
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0], dtype=torch.float64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"RESULT mode=torch_ddp ranks={world} step_ms={times[len(times) // 2] * 1e3:.1f} rss_mb={rss.item():.0f}",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and os.path.exists(rendezvous):
        os.remove(rendezvous)


if __name__ == "__main__":
    main()
