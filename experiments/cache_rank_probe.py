"""Which rows a GPU cache of hot rows should hold: the share of a sampler's reads that fall on
the top rows by each ranking. CPU only (the CPU sampler); a property of the graph and the
fanouts, not a timing, so it is measured here and predicts the GPU cache's hit rate.

Rankings: ``degree`` (row length), ``frequency`` (how many rows list the node), ``access``
(``torch_direct.gnn.graph.access_frequency`` with the last fanout: what ``train --cache-mb`` uses),
``presampled`` (the reads of as many other batches, drawn with another seed order and sampler
seed: a cache filled from a sampling pass before training, ties broken by ``access``) and
``oracle`` (the counted reads themselves: the best any ranking can do on these batches).

    python experiments/cache_rank_probe.py --dataset products-like --fractions 0.1,0.27,0.3
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import finish, run  # noqa: E402

from torch_direct.gnn.graph import NeighborSampler, access_frequency, load_dataset  # noqa: E402
from torch_direct.gnn.pipeline.options import fanout_list  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--dataset", default="arxiv-like", help="a preset or OGB name (default: %(default)s)")
    p.add_argument("--root", default=None, help="data set directory (default: train's)")
    p.add_argument("--fanouts", type=fanout_list, default=[15, 10, 5], help="as for train (default: 15,10,5)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default: %(default)s)")
    p.add_argument("--batches", type=int, default=40, help="batches sampled (default: %(default)s)")
    p.add_argument("--fractions", default="0.1,0.3", help="cache sizes as fractions of the rows (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="write the JSON record here")
    a = p.parse_args(argv)
    try:
        fracs = [float(f) for f in a.fractions.split(",")]
    except ValueError:
        p.error(f"--fractions: expected comma-separated numbers, got {a.fractions!r}")
    if not fracs or any(not 0 < f <= 1 for f in fracs):
        p.error(f"--fractions: each must be in (0, 1], got {a.fractions!r}")
    if a.batch_size <= 0 or a.batches <= 0:
        p.error("--batch-size and --batches must be positive")
    ds = load_dataset(a.dataset, root=a.root, show_progress=False)
    g = ds.graph
    train = ds.split["train"]
    n_batches = min(a.batches, train.numel() // a.batch_size)
    if n_batches < 1:
        raise ValueError(f"{a.dataset}'s {train.numel()} training nodes make no batch of {a.batch_size}")
    def count(order_seed: int, sampler_seed: int) -> torch.Tensor:
        seeds = train[torch.randperm(train.numel(), generator=torch.Generator().manual_seed(order_seed))]
        sampler = NeighborSampler(g, a.fanouts, seed=sampler_seed)
        reads = torch.zeros(g.num_nodes, dtype=torch.float64)
        for i in range(n_batches):
            n_id = sampler.sample(seeds[i * a.batch_size:(i + 1) * a.batch_size]).n_id
            reads.index_add_(0, n_id, torch.ones(n_id.numel(), dtype=torch.float64))
        return reads

    reads = count(0, 0)
    access = access_frequency(g, a.fanouts[-1]).double()
    presampled = count(1, 1) + access / (float(access.max()) + 1.0)   # reads first, then access
    scores = {"degree": g.degree().double(), "frequency": access_frequency(g).double(),
              "access": access, "presampled": presampled, "oracle": reads}
    total = float(reads.sum())
    record = {"tool": "cache_rank_probe", "dataset": a.dataset, "fanouts": a.fanouts, "batch_size": a.batch_size,
              "batches": n_batches, "rows": g.num_nodes, "reads": total, "held": {}}
    print(f"cache_rank_probe: {a.dataset}, {n_batches} batches of {a.batch_size}, fanouts "
          f"{','.join(map(str, a.fanouts))}: share of the reads on the top rows by each ranking")
    print("  rows cached   " + "  ".join(f"{k:>9s}" for k in scores))
    for f in fracs:
        k = max(1, int(f * g.num_nodes))
        held = {name: float(reads[torch.topk(s, k).indices].sum()) / total for name, s in scores.items()}
        record["held"][str(f)] = held
        print(f"  {f:10.0%}    " + "  ".join(f"{v:9.3f}" for v in held.values()))
    return finish(a.out, record)


if __name__ == "__main__":
    run("cache_rank_probe", main)
