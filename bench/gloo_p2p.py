"""What one point-to-point message between two CPU ranks costs over gloo: the fixed cost that the
pipeline's idle fraction holds beside the bubble proper (bench/pipeline_bubble.py).

    python bench/gloo_p2p.py [--width 512] [--batch 64] [--microbatches 2 4 8] [--rounds 200]

Two processes (gloo on 127.0.0.1, one thread each, as the pipeline bench's ranks) pass a tensor of
one micro-batch's activations (``batch / m`` x ``width`` float32) back and forth ``--rounds`` times;
a message's cost is half a round trip (the send on one side and the matching receive on the other,
with the wire between). Per pipeline step of 2 stages, each rank takes part in 2 m such messages
(m activations forward, m gradients back), which the script multiplies out. Prints a table; no
result file (the benchmarks page quotes its figures with the date)."""

from __future__ import annotations

import argparse
import os
import socket
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, shapes: list[tuple[int, int]], rounds: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    peer = 1 - rank
    for shape in shapes:
        tensor = torch.randn(shape)
        for timed in (False, True):  # a warm-up pass first
            dist.barrier()
            start = time.perf_counter()
            for _ in range(rounds if timed else 10):
                if rank == 0:
                    dist.send(tensor, peer)
                    dist.recv(tensor, peer)
                else:
                    dist.recv(tensor, peer)
                    dist.send(tensor, peer)
            if timed and rank == 0:
                out.put((shape, (time.perf_counter() - start) / (2 * rounds)))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    shapes = [(args.batch // m, args.width) for m in args.microbatches]
    context = mp.get_context("spawn")
    out = context.SimpleQueue()
    port = _free_port()
    processes = [context.Process(target=_worker, args=(rank, port, shapes, args.rounds, out)) for rank in (0, 1)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    print(f"gloo point-to-point on 127.0.0.1, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'m':>3} {'message':>12} {'KiB':>7} {'ms per message':>15} {'2m messages ms':>15}")
    for m, _ in zip(args.microbatches, shapes):
        shape, seconds = out.get()
        kib = shape[0] * shape[1] * 4 / 1024
        print(f"{m:>3} {str(shape):>12} {kib:>7.0f} {1e3 * seconds:>15.3f} {2 * m * 1e3 * seconds:>15.2f}")


if __name__ == "__main__":
    main()
