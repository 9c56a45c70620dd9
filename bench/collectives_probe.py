"""Which collectives a split job's process group can run on this machine's GPU: each one in a fresh pair of
processes (a crash in one kills only that pair), over gloo on GPU tensors and, for comparison, on CPU tensors,
and NCCL with both ranks on one GPU.

    python bench/collectives_probe.py OUT.json

A machine with one GPU cannot run a split job over NCCL (it refuses two ranks on one device); this says whether
gloo could stand in there, op by op. Each line: the op, the tensors' device and dtype, "ok", "wrong result" or how
the pair ended (a signal, an error's first line, a timeout).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from datetime import timedelta

CASES = [  # (backend, op, device, dtype)
    ("gloo", "all_reduce", "cpu", "bfloat16"),
    ("gloo", "all_to_all_single", "cpu", "bfloat16"),
    ("gloo", "all_reduce", "cuda", "float32"),
    ("gloo", "all_reduce", "cuda", "bfloat16"),
    ("gloo", "all_to_all_single", "cuda", "float32"),
    ("gloo", "all_to_all_single", "cuda", "bfloat16"),
    ("gloo", "all_gather_into_tensor", "cuda", "bfloat16"),
    ("gloo", "funcol.all_to_all_single", "cuda", "bfloat16"),
    ("gloo", "funcol.all_gather_tensor", "cuda", "bfloat16"),
    ("nccl", "all_reduce", "cuda", "float32"),
]


def _rank(rank: int, port: int, backend: str, op: str, device: str, dtype: str, answer) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    try:
        store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timedelta(seconds=30))
        if device == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group(backend, store=store, rank=rank, world_size=2, timeout=timedelta(seconds=30))
        kind = getattr(torch, dtype)
        x = torch.arange(8, device=device, dtype=torch.float32).to(kind) + 8 * rank
        if op == "all_reduce":
            dist.all_reduce(x)
            expected = torch.arange(8, dtype=torch.float32) * 2 + 8
        elif op == "all_to_all_single":
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x)
            x, expected = out, torch.cat([torch.arange(4) + 4 * rank, torch.arange(4) + 8 + 4 * rank]).float()
        elif op == "all_gather_into_tensor":
            out = torch.empty(16, device=device, dtype=kind)
            dist.all_gather_into_tensor(out, x)
            x, expected = out, torch.arange(16).float()
        elif op == "funcol.all_to_all_single":
            x = funcol.all_to_all_single(x, None, None, dist.group.WORLD).wait()
            expected = torch.cat([torch.arange(4) + 4 * rank, torch.arange(4) + 8 + 4 * rank]).float()
        else:
            x = funcol.all_gather_tensor(x, 0, dist.group.WORLD).wait()
            expected = torch.arange(16).float()
        if device == "cuda":
            torch.cuda.synchronize()
        answer.put((rank, "ok" if torch.equal(x.float().cpu(), expected) else f"wrong result {x.tolist()}"))
        dist.destroy_process_group()
    except Exception as exc:
        answer.put((rank, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))


def probe(case, port: int) -> str:
    context = mp.get_context("spawn")
    answer = context.Queue()
    pair = [context.Process(target=_rank, args=(rank, port, *case, answer)) for rank in range(2)]
    for process in pair:
        process.start()
    for process in pair:
        process.join(90)
    said = {}
    while not answer.empty():
        rank, words = answer.get()
        said[rank] = words
    ends = []
    for rank, process in enumerate(pair):
        if process.is_alive():
            process.kill()
            ends.append(f"rank {rank} timed out")
        elif process.exitcode and process.exitcode < 0:
            ends.append(f"rank {rank} killed by signal {-process.exitcode}")
    words = sorted(set(said.values()))
    return "; ".join(words + ends) or "no answer"


def main() -> None:
    import torch

    results = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available()
               else "none", "date": time.strftime("%Y-%m-%d"), "cases": []}
    for number, case in enumerate(CASES):
        if case[2] == "cuda" and not torch.cuda.is_available():
            continue
        started = time.perf_counter()
        outcome = probe(case, 29600 + number)
        results["cases"].append({"backend": case[0], "op": case[1], "device": case[2], "dtype": case[3],
                                 "outcome": outcome, "seconds": round(time.perf_counter() - started, 1)})
        print(f"{case[0]:5} {case[1]:26} {case[2]:5} {case[3]:9} {outcome}", flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
