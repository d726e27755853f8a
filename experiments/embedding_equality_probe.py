"""Step-by-step comparison of the embedding benchmark's tables: unified (twice) against the GPU.

    python experiments/embedding_equality_probe.py --dataset products-like --steps 30

Trains the benchmark's GraphSAGE over a learned embedding with three tables in lock step, each
with its own model and optimizers from the same seed, on the same sampled batches: a unified
table, a second unified table, and the table in GPU memory. After each step it prints the loss of
each, and the largest difference against the first unified table of the rows read, of the
coalesced sparse gradient and, after the optimizers, of the touched rows of the table and of
SparseAdam's two moments. A difference that starts at rounding size and grows slowly is float
noise amplified by training; a jump at one step points at that step's operation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_direct  # noqa: E402,F401
from torch_direct.gnn.bench import embedding as be  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="products-like")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write the per-step figures as JSON")
    args = ap.parse_args(argv)
    from torch_direct.gnn.graph import NeighborSampler, load_dataset
    from torch_direct.gnn.graph.sampler import seed_batches
    from torch_direct.gnn.pipeline.models import GNN, make_optimizer
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # (the CPU: a smoke run)
    ds = load_dataset(args.dataset, show_progress=False)
    init = be.initial_table(ds.num_nodes, args.dim, args.seed)
    names = ("unified_a", "unified_b", "gpu")
    runs = {}
    for name in names:
        torch.manual_seed(args.seed)
        table = be.make_table("gpu" if name == "gpu" else "unified", init, device, args.lr)
        model = GNN("sage", args.dim, 256, ds.num_classes, 3, use_pyg=False).to(device)
        runs[name] = (table, model, make_optimizer(model, args.lr))
    # Each run draws its dropout masks from its own copy of the seeded generators, as if it ran alone.
    torch.manual_seed(args.seed)
    rng = {name: (torch.get_rng_state(), torch.cuda.get_rng_state() if device.type == "cuda" else None)
           for name in names}
    sampler = NeighborSampler(ds.graph, [15, 10, 5], seed=args.seed, pin_memory=device.type == "cuda")
    seeds = seed_batches(ds.split["train"], 1024, generator=torch.Generator().manual_seed(args.seed))[:args.steps]
    steps = []

    def maxdiff(a, b):
        return float((a.to(device).float() - b.to(device).float()).abs().max()) if a.numel() else 0.0

    for i, batch in enumerate(seeds, 1):
        sb = sampler.sample_batches([batch])[0]
        n_id_dev, adjs, y = be._to_device(sb, ds.y, device)
        got = {}
        for name, (table, model, opt) in runs.items():
            torch.set_rng_state(rng[name][0])
            if device.type == "cuda":
                torch.cuda.set_rng_state(rng[name][1])
            model.train()
            opt.zero_grad(set_to_none=True)
            rows = table.rows(sb.n_id, n_id_dev)
            x = rows.detach().requires_grad_()
            loss = F.cross_entropy(model(x, adjs)[:sb.batch_size], y, ignore_index=-1)
            loss.backward()
            table.write_grad(rows, x.grad)
            g = table.weight.grad.coalesce()
            got[name] = {"loss": float(loss), "rows": rows.detach().clone(),
                         "grad_idx": g._indices().to(device), "grad_val": g._values().to(device)}
            table.step()
            opt.step()
            rng[name] = (torch.get_rng_state(), torch.cuda.get_rng_state() if device.type == "cuda" else None)
            st = table.opt.state[table.weight]
            ids = n_id_dev
            got[name].update(table=table.weight.detach()[ids].to(device), exp_avg=st["exp_avg"][ids].to(device),
                             exp_avg_sq=st["exp_avg_sq"][ids].to(device))
        ref = got["unified_a"]
        row = {"step": i, "loss": {n: got[n]["loss"] for n in names}}
        for n in names[1:]:
            o = got[n]
            same_idx = torch.equal(o["grad_idx"], ref["grad_idx"])
            row[n] = {"rows": maxdiff(o["rows"], ref["rows"]),
                      "grad_indices_equal": same_idx,
                      "grad": maxdiff(o["grad_val"], ref["grad_val"]) if same_idx else None,
                      "table": maxdiff(o["table"], ref["table"]),
                      "exp_avg": maxdiff(o["exp_avg"], ref["exp_avg"]),
                      "exp_avg_sq": maxdiff(o["exp_avg_sq"], ref["exp_avg_sq"])}
        steps.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "steps": steps},
                                       indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
