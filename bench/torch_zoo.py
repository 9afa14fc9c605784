# The PyTorch DDP side of `npm run bench -- train`: the zoo's models (examples/zoo/models.ts) built
# the same way in torch, trained with DistributedDataParallel over gloo on loopback, one thread per
# rank, on the same data (written by bench/train.ts), batch size per rank, Adam and learning rate.
#
#   python3 bench/torch_zoo.py MODEL P DATA_PREFIX BATCH WARMUP STEPS PORT OUT_JSON [DEVICE]
# DEVICE cuda: every rank on the first GPU, DDP over NCCL at P = 1 and gloo beyond (NCCL takes one
# rank per GPU), batches copied to the GPU per step as gradwire's are, each step timed to the GPU's end.
# Prints nothing; writes {"samplesPerSec": global samples/s, "stepMs": median of the slowest rank}.
import json, math, os, sys, time, statistics
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


class SelfAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.h = heads
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        dh = d // self.h
        split = lambda y: y.view(b, t, self.h, dh).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), dim=-1)
        return self.o((att @ v).transpose(1, 2).reshape(b, t, d))


class Transformer(nn.Module):
    def __init__(self, vocab, tags, seq, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList()
        for _ in range(2):
            self.blocks.append(nn.ModuleDict({"ln1": nn.LayerNorm(d), "att": SelfAttention(d, 2), "ln2": nn.LayerNorm(d),
                                              "ff": nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, d))}))
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, tags)

    def forward(self, x):
        h = self.emb(x) + self.pos
        for blk in self.blocks:
            h = h + blk["att"](blk["ln1"](h))
            h = h + blk["ff"](blk["ln2"](h))
        return self.out(self.ln(h))


class Lstm(nn.Module):
    def __init__(self, vocab, tags):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32)
        self.lstm = nn.LSTM(32, 64, batch_first=True)
        self.out = nn.Linear(64, tags)

    def forward(self, x):
        return self.out(self.lstm(self.emb(x))[0])


class Gru(nn.Module):
    def __init__(self, vocab, tags):
        super().__init__()
        self.emb = nn.Embedding(vocab, 32)
        self.gru = nn.GRU(32, 64, batch_first=True)
        self.out = nn.Linear(64, tags)

    def forward(self, x):
        return self.out(self.gru(self.emb(x))[0])


class Block(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(17, 8)
        self.conv = nn.Conv1d(8, 32, 9)
        self.out = nn.Linear(32, 10)

    def forward(self, x):
        h = F.relu(self.conv(self.emb(x).transpose(1, 2)))
        return self.out(h.max(dim=2).values)


class Basic(nn.Module):
    """ResNet's basic block: conv 3x3 (stride) + BN + ReLU, conv 3x3 + BN, plus the input or its 1x1 projection + BN."""
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.c1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(c_out)
        self.c2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.b2 = nn.BatchNorm2d(c_out)
        self.short = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        return F.relu(self.short(x) + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


def separable(c_in, c_out, stride):
    # depthwise 3x3 (groups = channels) + BN + ReLU6, pointwise 1x1 + BN + ReLU6
    return [nn.Conv2d(c_in, c_in, 3, stride=stride, padding=1, groups=c_in, bias=False), nn.BatchNorm2d(c_in), nn.ReLU6(),
            nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU6()]


def build(name, meta):
    img = lambda s: nn.Unflatten(1, (1, s, s))
    if name == "mlp":
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    if name == "cnn":
        return nn.Sequential(img(8), nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                             nn.Flatten(), nn.Linear(256, 10))
    if name == "lenet":
        return nn.Sequential(img(28), nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
    if name == "resnet":
        return nn.Sequential(img(8), nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), Block(), Block(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    if name == "resnet28":
        return nn.Sequential(img(28), nn.Conv2d(1, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), Block(32), Block(32),
                             nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), Block(64), Block(64),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    if name == "resnet18":
        stages = [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2), (512, 512, 1)]
        return nn.Sequential(img(32), nn.Conv2d(1, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                             *[Basic(i, o, s) for i, o, s in stages], nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10))
    if name == "mobilenet":
        return nn.Sequential(img(28), nn.Conv2d(1, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
                             *separable(16, 32, 1), *separable(32, 64, 2), *separable(64, 64, 1),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    if name == "embedding":
        return Tokens()
    if name == "transformer":
        return Transformer(meta["vocab"], meta["tags"], meta["seqLen"])
    if name == "lstm":
        return Lstm(meta["vocab"], meta["tags"])
    if name == "gru":
        return Gru(meta["vocab"], meta["tags"])
    raise ValueError(name)


def worker(rank, p, name, prefix, batch, warmup, steps, port, out, device="cpu"):
    torch.set_num_threads(1)
    torch.manual_seed(1)
    cuda = device == "cuda"
    dist.init_process_group("nccl" if cuda and p == 1 else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=p)
    meta = json.load(open(prefix + ".json"))
    x = np.fromfile(prefix + ".x", dtype=np.float32).reshape(meta["rows"], -1)
    y = np.fromfile(prefix + ".y", dtype=np.int32).reshape(meta["rows"], -1)
    xs = torch.from_numpy(x.astype(np.int64) if meta["int"] else x)
    ys = torch.from_numpy(y.astype(np.int64))
    classes = meta.get("tags", 10)
    model = DDP(build(name, meta).to(device))
    opt = torch.optim.Adam(model.parameters(), lr=0.003)
    rows = torch.arange(rank, meta["rows"], p)
    at = [0]

    def step():
        if at[0] + batch > len(rows):
            at[0] = 0
        idx = rows[at[0]:at[0] + batch]
        at[0] += batch
        opt.zero_grad()
        logits = model(xs[idx].to(device))
        loss = F.cross_entropy(logits.reshape(-1, classes), ys[idx].to(device).reshape(-1))
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    dist.barrier()
    times = []
    t0 = time.perf_counter()
    for _ in range(steps):
        s = time.perf_counter()
        step()
        times.append((time.perf_counter() - s) * 1000)
    total = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    med = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"samplesPerSec": steps * batch * p / total.item(), "stepMs": med.item()}, f)
    # destroy_process_group() sometimes never returns here once BatchNorm buffers were broadcast
    # (torch 1.13, gloo): the figures are written, so every rank leaves after a last barrier.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    name, p, prefix, batch, warmup, steps, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), sys.argv[8]
    device = sys.argv[9] if len(sys.argv) > 9 else "cpu"
    mp.spawn(worker, args=(p, name, prefix, batch, warmup, steps, port, out, device), nprocs=p, join=True)
