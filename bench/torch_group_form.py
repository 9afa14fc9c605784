# The PyTorch side of `npm run bench -- group-form`: P ranks on loopback join a gloo process group
# (a TCP store), then ROUNDS times, after a barrier, time dist.new_group over all ranks (gloo
# connects every pair as it builds the group) and one 4-byte all_reduce on it, as a regroup that
# forms a new process group does (torchft reconfigures its gloo group on every quorum change).
#
#   python3 bench/torch_group_form.py P ROUNDS PORT OUT_JSON
# Writes {"ms": [slowest rank's ms per round]}.
import json, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp


def rank_main(rank, p, rounds, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=p)
    times = []
    one = torch.zeros(1)
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        g = dist.new_group(list(range(p)), backend="gloo")
        dist.all_reduce(one, group=g)
        times.append((time.perf_counter() - t0) * 1000)
    slowest = torch.tensor(times)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"ms": slowest.tolist()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    p, rounds, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    mp.spawn(rank_main, args=(p, rounds, port, out), nprocs=p, join=True)
