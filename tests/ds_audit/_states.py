"""A hand-made probe state (what a matrix case records), shared by the ds_audit tests."""


def state(c, *, steps=1, tol=1e-3, resid=1e-9, gn=None, rok=None, kept_norm=0.25, clip=0.0, clip_applied=1.0,
          clip_full=1.0, cpu_ok=True):
    step = {"contributions": list(c), "residual": resid, "grad_norm_ratio": gn, "reported_over_kept": rok,
            "kept_norm": kept_norm, "clip_applied": clip_applied, "clip_full": clip_full, "true_norm": 0.25,
            "applied_norm": 0.25, "reported_norm": None, "max_param_dev": 0.0}
    dropped = [i for i, x in enumerate(c) if abs(x) <= tol]
    faithful = all(abs(x - clip_full) <= tol for x in c) and resid <= tol
    return {"status": "ok", "seconds": 0.1, "result": {
        "per_step": [dict(step) for _ in range(steps)], "tolerance": tol, "slots_per_rank": len(c), "world": 1,
        "clip": clip, "faithful": faithful, "dropped": [dropped] * steps,
        "extra": {"cpu_reduce_buckets_work": cpu_ok}}}
