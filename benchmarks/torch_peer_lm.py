"""The PyTorch twin of tests/support/toy_lm.h's ToyLM, for the peer benchmarks and the FSDP2
parity test: embedding, blocks of (norm scale, Linear, tanh, Linear, residual), a final norm
scale and a head tied to the embedding. Parameter names are ToyLM's (`embed.weight`,
`layers0.fc1.weight`, `final_norm`, ...), so a safetensors file of one loads into the other.

Also the job set-up both peers share: the process group from the launcher's environment
(MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE, as torchrun sets them; our launcher reserves
MASTER_PORT for rank 0 to bind) and the step's batch, drawn with ATen's generator exactly as
the C++ side draws it (the same torch build, so the same numbers).
"""
import resource

import torch
import torch.distributed as dist
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.norm = nn.Parameter(torch.ones(dim))
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x * self.norm)))


class ToyLM(nn.Module):
    def __init__(self, vocab, dim, hidden, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = []
        for i in range(layers):
            block = Block(dim, hidden)
            self.add_module(f"layers{i}", block)
            self.blocks.append(block)
        self.final_norm = nn.Parameter(torch.ones(dim))

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return (h * self.final_norm) @ self.embed.weight.t()


def init_process_group():
    """Gloo over the launcher's env:// rendezvous; returns (rank, world size)."""
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def rows_of_rank(seq, rank, world):
    """This rank's equal share of the global batch's rows."""
    per_rank = seq.shape[0] // world
    return seq[rank * per_rank:(rank + 1) * per_rank]


def next_token_loss(model, seq, vocab):
    logits = model(seq[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, vocab), seq[:, 1:].reshape(-1))


def peak_rss_mb_max_over_ranks():
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0], dtype=torch.float64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    return rss.item()
