"""Several GPUs, one host copy: ``torchrun --nproc-per-node=N -m torch_direct train ...``.

Under torchrun (``WORLD_SIZE`` > 1 in the environment) ``train`` runs one process per GPU:

- **Process group.** NCCL between GPUs (``cuda:LOCAL_RANK``), gloo with ``--device cpu``;
  torchrun's rendezvous, so several nodes work as torchrun documents (``--nnodes``,
  ``--rdzv-endpoint``).
- **One host copy per node.** The node's local rank 0 loads the data set and copies every
  array (features, CSR, labels, splits) into files under ``/dev/shm``; the other ranks of the
  node map the same pages, and once all have mapped them the files are unlinked (nothing is
  left in ``/dev/shm`` whatever happens next). Each process then page-locks those shared
  pages for its GPU (``torch_direct.pin_inplace``): no process holds a copy of the table.
- **Seeds.** Every rank draws the same permutation of the training seeds each epoch and
  takes its share (``perm[rank::world]``, cut to the same length on every rank so that all
  take the same number of steps); sampled evaluation splits its seeds the same way.
- **Model.** DistributedDataParallel; losses, accuracies and epoch times are all-reduced
  (time: the slowest rank) and printed by rank 0, which alone writes JSON and plots.
  ``--full-eval``: each rank infers its share of the test nodes over full neighbourhoods.
- **Failure.** A rank that raises records its error in the job's store before it exits;
  torchrun then stops the others, and each prints the failing rank's error as it stops.
- **Memory.** Every rank reports its proportional set size (PSS: shared pages divided among
  the processes that map them); their sum is the job's host memory, printed and recorded.
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import signal
import sys
import uuid
from dataclasses import dataclass

import torch
import torch.distributed as dist

ERROR_KEY = "torch_direct/error"
SHM_DIR = "/dev/shm"


def requested() -> bool:
    """True under torchrun (or any launcher) with more than one process, or with one process
    and ``TORCH_DIRECT_DISTRIBUTED=1`` (the 1-GPU baseline of a scaling run takes the same path)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ValueError(f"WORLD_SIZE must be an int, got {os.environ.get('WORLD_SIZE')!r}") from None
    forced = os.environ.get("TORCH_DIRECT_DISTRIBUTED") == "1" and "RANK" in os.environ
    return world > 1 or forced


def _env_int(name: str, default=None) -> int:
    v = os.environ.get(name)
    if v is None:
        if default is None:
            raise RuntimeError(f"distributed training: {name} is not set (start the job with torchrun)")
        return default
    try:
        return int(v)
    except ValueError:
        raise RuntimeError(f"distributed training: {name} must be an int, got {v!r}") from None


def host_pss_bytes() -> int:
    """This process's proportional set size (Linux; 0 where /proc has no smaps_rollup)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Context:
    """The process's place in the job and the collectives ``train`` needs."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    node: int
    device: torch.device
    backend: str

    @property
    def main(self) -> bool:
        return self.rank == 0

    def _tensor(self, values, dtype=torch.float64):
        dev = self.device if self.backend == "nccl" else torch.device("cpu")
        return torch.tensor(values, dtype=dtype, device=dev)

    def all_sum(self, values: list[float]) -> list[float]:
        t = self._tensor(values)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def all_max(self, values: list[float]) -> list[float]:
        t = self._tensor(values)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def record_error(self, exc: BaseException) -> None:
        """Leave this rank's error in the job's store for the ranks torchrun will stop."""
        try:
            store = dist.distributed_c10d._get_default_store()
            store.set(ERROR_KEY, f"rank {self.rank}: {type(exc).__name__}: {exc}")
        except Exception:  # the store may be gone already: the error still reaches torchrun
            pass

    def peer_error(self) -> str | None:
        """The error another rank recorded, if any (without waiting)."""
        try:
            store = dist.distributed_c10d._get_default_store()
            if store.check([ERROR_KEY]):
                return store.get(ERROR_KEY).decode()
        except Exception:
            pass
        return None

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
            # A DistributedDataParallel module sits in reference cycles that hold the group (and
            # so gloo's loop threads and the store's server thread) after `del model`: they end
            # only when the cycle collector next runs, which may be at interpreter shutdown, where
            # gloo's threads can abort the process. Collect now, so that close() frees them.
            gc.collect()


def init(device_arg: str | None) -> Context:
    """Join the job torchrun started; ``device_arg`` is ``--device`` (None, ``cuda`` or ``cpu``)."""
    from .features import cuda_usable
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    node = _env_int("GROUP_RANK", rank // max(1, local_world))
    if device_arg not in (None, "cpu", "cuda"):
        raise ValueError(f"--device {device_arg}: under torchrun each rank takes cuda:LOCAL_RANK; give "
                         f"--device cuda or --device cpu")
    use_cuda = device_arg != "cpu" and cuda_usable()
    if device_arg == "cuda" and not use_cuda:
        raise ValueError("--device cuda: no usable GPU here")
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"rank {rank}: LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} "
                               f"GPU(s) here: start at most that many processes per node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        # Before the group exists: torch.distributed.nn.functional takes ``group.WORLD`` as the
        # default argument of its functions when first imported (DDP's constructor imports it,
        # through torch.distributed._shard). Imported after init_process_group, it holds the
        # default group for good: destroy_process_group cannot free it, and gloo's worker threads
        # run on into interpreter shutdown, where the one that drops the last reference to a
        # finished all_reduce's tensor (its Python object) must take the GIL, is ended by Python
        # with a forced unwind through a noexcept destructor and aborts the rank ("terminate
        # called without an active exception"). Imported now, those defaults are None.
        from torch.distributed.nn import functional as _  # noqa: F401
        # Ranks wait for each other in a collective after work whose share can be uneven (the
        # receptive fields of --full-eval's test nodes): minutes on papers100M-like, more than
        # NCCL's default 10-minute timeout allows for.
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=60))
    _stop_cleanly_on_sigterm()
    return Context(rank, world, local_rank, local_world, node, device, backend)


_stopping = False  # this rank is already stopping: a later SIGTERM must not cut its report short


def _stop_cleanly_on_sigterm() -> None:
    """torchrun stops the other ranks with SIGTERM when one fails: turn it into SystemExit so
    that ``finally`` blocks run (shared-memory files, loader threads). Once the rank is stopping
    (this signal, or an error already on its way to :func:`report_stop`), further SIGTERMs are
    let pass: one arriving while the rank reads the failing rank's error would otherwise end it
    before it says why it stopped."""
    def handler(signum, frame):
        global _stopping
        if _stopping:
            return
        _stopping = True
        raise SystemExit(128 + signum)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, handler)


# -- one host copy per node ---------------------------------------------------------------------------

def _dataset_arrays(ds) -> dict[str, torch.Tensor]:
    arrays = {"x": ds.x, "y": ds.y, "rowptr": ds.graph.rowptr, "col": ds.graph.col}
    if ds.graph.edge_ids is not None:
        arrays["edge_ids"] = ds.graph.edge_ids
    for k, v in ds.split.items():
        arrays[f"split:{k}"] = v
    return arrays


def _to_shm(t: torch.Tensor, path: str) -> torch.Tensor:
    t = t.contiguous()
    if t.numel() == 0:
        return torch.empty(t.shape, dtype=t.dtype)
    out = torch.from_file(path, shared=True, size=t.numel(), dtype=t.dtype).view(t.shape)
    out.copy_(t)
    return out


def _map_shm(path: str, shape, dtype) -> torch.Tensor:
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if not os.path.exists(path):
        raise RuntimeError(f"shared data set file {path} is missing: its node's local rank 0 did not "
                           f"publish it (or removed it early)")
    return torch.from_file(path, shared=True, size=numel, dtype=dtype).view(shape)


def _rebuild(meta: dict, arrays: dict[str, torch.Tensor]):
    from ..graph import CSRGraph, NodeDataset
    graph = CSRGraph(arrays["rowptr"], arrays["col"], arrays.get("edge_ids"), validate=False)
    split = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("split:")}
    return NodeDataset(meta["name"], graph, arrays["x"], arrays["y"], split, meta["num_classes"], meta["info"])


def shared_dataset(ctx: Context, load):
    """The data set, loaded once per node (``load()`` on the node's local rank 0) into shared
    memory that every rank of the node maps. Global rank 0 loads first, so a data set that has
    to be generated is generated once into the cache the others then read."""
    meta, shared, paths = None, None, []
    try:
        if ctx.rank == 0:
            meta, shared, paths = _publish(ctx, load())
        ctx.barrier()
        if ctx.local_rank == 0 and ctx.rank != 0:
            meta, shared, paths = _publish(ctx, load())
        metas = [None] * ctx.world
        dist.all_gather_object(metas, meta)
        mine = next((m for m in metas if m is not None and m["node"] == ctx.node), None)
        if mine is None:
            raise RuntimeError(f"rank {ctx.rank}: no local rank 0 published the data set on node {ctx.node}")
        if ctx.local_rank == 0:
            arrays = shared  # its own tensors over the files it wrote
        else:
            arrays = {k: _map_shm(a["path"], a["shape"], getattr(torch, a["dtype"]))
                      for k, a in mine["arrays"].items()}
        ctx.barrier()  # every rank of the node has mapped the files
    finally:
        _unlink_all(paths)  # mappings outlive the names: nothing is left under /dev/shm
    return _rebuild(mine, arrays)


def _unlink_all(paths: list[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:  # an empty array has no file
            pass


def _publish(ctx: Context, ds) -> tuple[dict, dict[str, torch.Tensor], list[str]]:
    """Copy ``ds``'s arrays into new files under /dev/shm: (the record other ranks map them by,
    the tensors over those files, the file paths)."""
    tag = f"torch_direct-{uuid.uuid4().hex[:12]}-node{ctx.node}"
    arrays, shared, paths = _dataset_arrays(ds), {}, []
    if not os.path.isdir(SHM_DIR):
        raise RuntimeError(f"distributed training shares the data set through {SHM_DIR}, which this "
                           f"machine lacks")
    need = sum(t.numel() * t.element_size() for t in arrays.values())
    st = os.statvfs(SHM_DIR)
    free = st.f_bavail * st.f_frsize
    if need > free:  # a full tmpfs would kill the writer with SIGBUS, not raise
        raise RuntimeError(f"the data set needs {need / 2**30:.2f} GiB in {SHM_DIR}, which has "
                           f"{free / 2**30:.2f} GiB free (in a container: docker run --shm-size=...)")
    try:
        for k, t in arrays.items():
            path = os.path.join(SHM_DIR, f"{tag}-{k.replace(':', '-')}")
            paths.append(path)
            shared[k] = _to_shm(t, path)
    except BaseException:
        _unlink_all(paths)
        raise
    meta = {"node": ctx.node, "name": ds.name, "num_classes": ds.num_classes, "info": ds.info,
            "arrays": {k: {"path": p, "shape": list(t.shape), "dtype": str(t.dtype).split(".")[1]}
                       for (k, t), p in zip(shared.items(), paths)}}
    return meta, shared, paths


def pinned_graph(graph):
    """The CSR over the same (shared) pages, page-locked for the GPU sampler: no copy."""
    import torch_direct
    from ..graph import CSRGraph
    pin = torch_direct.pin_inplace
    return CSRGraph(pin(graph.rowptr), pin(graph.col),
                    None if graph.edge_ids is None else pin(graph.edge_ids), validate=False)


def fail_injected(rank: int, epoch: int) -> None:
    """Test hook: ``TORCH_DIRECT_FAIL_AT=rank:epoch`` makes that rank raise at that epoch."""
    spec = os.environ.get("TORCH_DIRECT_FAIL_AT")
    if not spec:
        return
    try:
        r, e = (int(v) for v in spec.split(":"))
    except ValueError:
        raise ValueError(f"TORCH_DIRECT_FAIL_AT must be rank:epoch, got {spec!r}") from None
    if (r, e) == (rank, epoch):
        raise RuntimeError(f"injected failure on rank {rank} at epoch {epoch} (TORCH_DIRECT_FAIL_AT)")


def report_stop(ctx: Context, exc: BaseException) -> BaseException | None:
    """On a rank that stops with ``exc``: if another rank failed first, the error to raise
    instead (naming that rank and its error); else record ``exc`` for the others and return
    None. A stop by the launcher (SIGTERM) prints the failing rank's error, if known."""
    global _stopping
    _stopping = True
    peer = ctx.peer_error()
    if peer and peer.startswith(f"rank {ctx.rank}:"):
        peer = None
    if isinstance(exc, SystemExit):
        print(f"rank {ctx.rank}: stopped" + (f": {peer}" if peer else " by the launcher"),
              file=sys.stderr, flush=True)
        return None
    if peer:
        return RuntimeError(f"stopped: {peer}")
    ctx.record_error(exc)
    return None
