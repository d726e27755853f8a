"""The targets ``bench train`` checks in each record it writes (``record["targets"]``)."""

from __future__ import annotations


# The project's targets on the H200 (GraphSAGE, 3 layers, hidden 256, fanouts 15,10,5, batch 1024):
# epoch ratios on products-like, the papers100M-like epochs, and the accuracy checks anywhere.
SPEED_TARGETS = (("unified_vs_cpu_centric", ">=", 4.0), ("unified_vs_pyg", ">=", 3.0),
                 ("gpu_resident_vs_unified", "<=", 1.10))
PAPERS_EPOCH_S = {"unified": 3.0, "gpu_resident": 2.5}
ACC_POINTS = 0.01   # "within noise" / "within one point": one accuracy point
# unified's figures count as features in host memory while the GPU holds at most this share of
# the table's bytes, its cache and the row scales kept there together (papers100M-like's target
# says half; elsewhere a cache may hold anything short of the whole table); beyond it, the
# speed targets involving unified are not met
MAX_DEVICE_SHARE = {"papers100M-like": 0.5}


def _cache_disqualifies(dataset: str, share: float) -> str | None:
    """Why unified's figure does not count as one with the features in host memory, the GPU
    having held ``share`` of the table's bytes (None: it counts)."""
    held = f"unified held {share:.1%} of the table's bytes in GPU memory (its cache and row scales)"
    limit = MAX_DEVICE_SHARE.get(dataset)
    if limit is not None and share > limit:
        return f"{held}, more than the {limit:.0%} a features-in-host-memory figure allows"
    if share >= 1.0:
        return f"{held}, so no row was read from host memory"
    return None


def _device_share(rows) -> float:
    """The share of the table's bytes the unified row's GPU held: its cache and the row scales
    kept there (``device_share``; a record without it: the cache's share of the rows)."""
    for r in rows:
        if r["pipeline"] == "unified":
            store = r.get("feature_store") or {}
            return float(store.get("device_share", store.get("cached_share", 0.0)))
    return 0.0


def add_targets(record: dict) -> None:
    """``record["targets"]``: each target that this run can check, with its value and whether it
    is met. Speed targets are set on products-like (and the epoch for papers100M-like);
    the accuracy ones hold on any data set."""
    targets = []
    dataset = str(record["args"].get("dataset"))
    ran = [r for r in record["rows"] if r["status"] == "ok"]
    why = _cache_disqualifies(dataset, _device_share(ran))
    host, cached = why is None, f"; {why}"
    for key, op, want in SPEED_TARGETS:      # every one involves unified
        v = record["ratios"].get(key)
        if v is not None:
            met = v >= want if op == ">=" else v <= want
            targets.append({"name": f"{key} ({dataset}; the target is set on products-like"
                                    f"{'' if host else cached})", "value": v,
                            "want": f"{op} {want}", "met": met and host})
    if dataset == "papers100M-like":
        for r in ran:
            want = PAPERS_EPOCH_S.get(r["pipeline"])
            if want is not None:
                ok = host or r["pipeline"] != "unified"
                targets.append({"name": f"{r['pipeline']} epoch seconds (papers100M-like{'' if ok else cached})",
                                "value": r["epoch_s"], "want": f"<= {want}", "met": r["epoch_s"] <= want and ok})
    if len(ran) > 1:
        accs = [r["test_acc"] for r in ran]
        spread = max(accs) - min(accs)
        targets.append({"name": "test accuracy spread over the pipelines", "value": spread,
                        "want": f"<= {ACC_POINTS}", "met": spread <= ACC_POINTS})
    for r in ran:
        if "test_acc_full" in r:
            gap = abs(r["test_acc"] - r["test_acc_full"])
            targets.append({"name": f"{r['pipeline']}: sampled vs full-neighbourhood test accuracy", "value": gap,
                            "want": f"<= {ACC_POINTS}", "met": gap <= ACC_POINTS})
    record["targets"] = targets
