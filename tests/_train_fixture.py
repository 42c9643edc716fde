"""A small training run through the harness, used by test_harness.py (run as a subprocess so it can be killed).

usage: python _train_fixture.py OUT_DIR STEPS [--sleep S] [--nan-at K] [--die-at K] [--no-rng-restore]

--die-at K         SIGKILL itself after step K (the checkpoint of the last multiple of 4 <= K is on disk).
--no-rng-restore   resume model/optimizer state but not the RNG states: a broken resume, for the guard test.
"""

import argparse
import os
import signal
import time

import torch

import gradfidelity.harness.run as harness_run
from gradfidelity.harness import Run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("steps", type=int)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--nan-at", type=int, default=-1)
    ap.add_argument("--die-at", type=int, default=-1)
    ap.add_argument("--no-rng-restore", action="store_true")
    args = ap.parse_args()
    if args.no_rng_restore:
        harness_run.set_rng_state = lambda state: None
    cfg = {"steps": args.steps, "width": 16}
    with Run(args.out, study="fixture", config=cfg, seed=3, threads=1, checkpoint_every=4) as run:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        state = {"model": model, "opt": opt}
        start, extra = run.resume(state)
        history = extra.get("history", [])
        for step in run.progress(range(start, args.steps)):
            x = torch.randn(32, 8)  # drawn from the global RNG: resume must restore it exactly
            y = x.sum(dim=1, keepdim=True).sin()
            loss = torch.nn.functional.mse_loss(model(x), y)
            if step == args.nan_at:
                loss = loss * float("nan")
            run.check_finite(loss, step)
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(float(loss))
            run.maybe_checkpoint(step + 1, state, extra={"history": history})
            if step + 1 == args.die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(args.sleep)
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        run.finish({"final_loss": history[-1], "history": history, "weight_sum": float(weights.sum())})


if __name__ == "__main__":
    main()
