"""A run's committed records (harness/records.py) and the run in parts (parts.py): a runs table restores the
records it was built from, a replay of a committed run is checked against its record (bit for bit on the same host
type, within the measured drift elsewhere, and a chaotic metric is a mismatch), parts split by whole seeds."""

import json

import pandas as pd
import pytest

from gradfidelity.errors import UserError
from gradfidelity.harness.io import atomic_write_csv, atomic_write_json
from gradfidelity.harness.records import check, restore
from gradfidelity.harness.results import runs_table
from gradfidelity.parts import part_seeds, seed_of, split

AMD = {"cpu_model": "AMD EPYC", "cpu_count": 2, "cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model_number": 17,
       "cpu_stepping": 1, "cpu_capability": "AVX512", "cpu_flags": "avx2 avx512f avx512_bf16", "cpu_isa_limits": "none"}
INTEL = {**AMD, "cpu_model": "Intel Xeon", "cpu_vendor": "GenuineIntel", "cpu_family": 6, "cpu_model_number": 167}


def _run(run_dir, *, loss=3.5, curve=(5.0, 4.0), wall=10.0, machine=AMD, study="async_pp", seed=0):
    """A finished run as the harness leaves it: metrics.json and provenance.json."""
    atomic_write_json(run_dir / "metrics.json", {
        "status": "ok", "study": study, "scale": "cpu", "seed": seed, "threads": 1,
        "cell": {"study": study, "seed": str(seed)},
        "metrics": {"final_val_loss": loss, "curve": list(curve)}, "timing": {"wall_s": wall}})
    atomic_write_json(run_dir / "provenance.json", {
        "study": study, "scale": "cpu", "seed": seed, "status": "ok", "git_sha": "abc", "git_dirty": False,
        "git_dirty_files": [], "git_dirty_outputs": ["paper_tables/cpu/x.md"], "machine": machine,
        "threads": {"torch_num_threads": 1, "OMP_NUM_THREADS": "1"}, "resumed_from_step": None,
        "checkpoints_discarded": [], "packages": {"torch": "2.13.0"}})
    return run_dir / "metrics.json"


def _drift(repo, study="async_pp", metric="final_val_loss", rel=0.002):
    atomic_write_csv(pd.DataFrame([{"study": study, "run": "r", "metric": metric, "rel_difference": rel}]),
                     repo / "results/cpu/reference/drift_test.csv")


def test_a_runs_table_restores_the_records_it_was_built_from(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = [_run(tmp_path / f"results/cpu/async_pp/cell/seed{k}", seed=k, loss=3.5 + k) for k in range(3)]
    table = runs_table([p.relative_to(tmp_path) for p in paths], "cpu")
    atomic_write_csv(table, tmp_path / "runs.csv")
    for p in paths:
        p.parent.joinpath("metrics.json").unlink()
        p.parent.joinpath("provenance.json").unlink()
    written = restore(tmp_path / "runs.csv", tmp_path)
    assert len(written) == 3
    rebuilt = runs_table([p.relative_to(tmp_path) for p in paths], "cpu")
    atomic_write_csv(rebuilt, tmp_path / "rebuilt.csv")
    assert (tmp_path / "rebuilt.csv").read_text() == (tmp_path / "runs.csv").read_text()
    prov = json.loads((paths[0].parent / "provenance.json").read_text())
    assert prov["restored_from"].endswith("runs.csv")
    bench = (paths[0].parent / "benchmark.tsv").read_text().splitlines()
    assert bench[0].split("\t")[0] == "s" and set(bench[1].split("\t")) == {"-"}  # not measured, said so
    # a run's own record is never replaced by a restored one unless asked
    assert restore(tmp_path / "runs.csv", tmp_path) == []


def test_a_table_without_metrics_json_cannot_restore(tmp_path):
    pd.DataFrame([{"run_id": "results/cpu/local/x", "study": "local"}]).to_csv(tmp_path / "old.csv", index=False)
    with pytest.raises(UserError, match="no metrics_json"):
        restore(tmp_path / "old.csv", tmp_path)


def test_a_replay_equal_to_its_record_passes_and_wall_clock_is_ignored(tmp_path):
    committed = _run(tmp_path / "run", wall=10.0)
    fresh = _run(tmp_path / "run/replay", wall=99.0)
    assert "equals its committed record" in check(committed, fresh, tmp_path)


def test_a_replay_that_differs_on_the_same_host_type_stops_naming_both_records(tmp_path):
    committed = _run(tmp_path / "run")
    fresh = _run(tmp_path / "run/replay", curve=(5.0, 4.0000001))  # the scalars agree; the record does not
    with pytest.raises(UserError) as err:
        check(committed, fresh, tmp_path)
    assert str(committed) in str(err.value) and str(fresh) in str(err.value)
    assert "same host type" in str(err.value) and "No downstream job trains on it" in str(err.value)


def test_across_host_types_a_drifting_metric_is_judged_by_its_rule(tmp_path):
    _drift(tmp_path, rel=0.002)  # rule: rel <= 0.005
    committed = _run(tmp_path / "run", loss=3.500)
    assert "equals" in check(committed, _run(tmp_path / "a/replay", loss=3.510, machine=INTEL), tmp_path)
    with pytest.raises(UserError, match="rerun the study whole"):
        check(committed, _run(tmp_path / "b/replay", loss=3.600, machine=INTEL), tmp_path)


def test_across_host_types_a_chaotic_metric_is_a_mismatch(tmp_path):
    _drift(tmp_path, rel=0.6)  # above the largest comparable drift: not comparable across hosts
    committed = _run(tmp_path / "run", loss=3.5)
    with pytest.raises(UserError, match="another draw on this host type"):
        check(committed, _run(tmp_path / "replay", loss=3.5000001, machine=INTEL), tmp_path)


def test_across_host_types_an_identical_value_is_equal(tmp_path):
    """Issue 56: a study-B cell's selected LR, identical across host types (0.008 -> 0.008), counted as a mismatch
    because its rule says "not comparable". Equal is equal on any host type; a moved value still is not."""
    atomic_write_csv(pd.DataFrame([{"study": "async_pp", "run": "r", "metric": "lr", "rel_difference": 2.0},
                                   {"study": "async_pp", "run": "r", "metric": "final_val_loss",
                                    "rel_difference": 0.002}]), tmp_path / "results/cpu/reference/drift_test.csv")

    def run(path, lr, loss, machine):
        metrics = _run(path, loss=loss, machine=machine)
        record = json.loads(metrics.read_text())
        record["metrics"]["lr"] = lr
        atomic_write_json(metrics, record)
        return metrics

    committed = run(tmp_path / "run", 0.008, 3.5, AMD)
    assert "equals its committed record" in check(committed, run(tmp_path / "a/replay", 0.008, 3.501, INTEL),
                                                  tmp_path)
    assert "equals its committed record" in check(committed, run(tmp_path / "b/replay", 0.008, 3.5, INTEL),
                                                  tmp_path)  # the whole record equal too
    with pytest.raises(UserError, match=r"lr: 0.008 -> 0.004 \(not comparable"):
        check(committed, run(tmp_path / "c/replay", 0.004, 3.5, INTEL), tmp_path)


def test_parts_split_by_whole_seeds():
    paths = [f"results/cpu/local/enwik8/w32/{m}/seed{s}/metrics.json" for s in range(5) for m in ("bp", "rgc")]
    parts = [split(paths, k, 2) for k in (1, 2)]
    assert sorted(parts[0] + parts[1]) == sorted(paths)
    assert {seed_of(p) for p in parts[0]} == {0, 1} and {seed_of(p) for p in parts[1]} == {2, 3, 4}
    assert split(["results/cpu/sft_rl/m/base/seed0/metrics.json", "results/cpu/x/lr~x1/metrics.json"], 1, 1)
    with pytest.raises(UserError):
        split(paths, 3, 2)


def test_parts_are_cut_from_the_runs_missing_now_so_the_next_part_is_1_of_the_rest():
    """The trap this guards: after part 1/2's records are committed, '2/2' is the second half of what is left, so
    running 1/2 then 2/2 skips the middle seeds; the rest split again as 1/1 covers them all."""
    paths = [f"results/cpu/async_pp/c{c}/seed{s}/metrics.json" for s in range(14, 25) for c in range(2)]
    assert part_seeds(paths, 2) == [[14, 15, 16, 17, 18], [19, 20, 21, 22, 23, 24]]
    rest = [p for p in paths if seed_of(p) >= 19]  # part 1's records committed
    assert part_seeds(rest, 2)[1] == [22, 23, 24]  # '2/2' now: seeds 19-21 would never run
    assert part_seeds(rest, 1) == [[19, 20, 21, 22, 23, 24]]


def test_check_rebuild_forces_analysis_jobs_only_and_leaves_out_studies_without_records(monkeypatch, tmp_path):
    """The checkpoints come from the --forceall dry run (a "checkpoint" line is a job of its own, not more outputs of
    the job before it); every other analysis output from `snakemake --summary`, which lists what lies downstream of
    a checkpoint (round 5: study A's aggregate, tables and claims, which the dry run cannot list); a rule with any
    record, bench or data output is never forced; a study without all its records is left out."""
    import subprocess

    import gradfidelity.rebuild as rebuild

    dry = """rule async_pp_train:
    output: results/cpu/async_pp/c/seed0/metrics.json
localcheckpoint async_pp_lr_round:
    output: results/cpu/async_pp/lr_rounds/round0.json
rule async_pp_bench:
    output: results/cpu/bench/async_pp.json
rule local_data:
    output: results/cpu/local/data/enwik8/train.bin
"""
    rows = [("results/cpu/async_pp/c/seed0/metrics.json", "async_pp_train"),
            ("results/cpu/async_pp/c/seed0/curve.json", "async_pp_train"),  # a training rule's other output
            ("results/cpu/async_pp/runs.csv", "async_pp_aggregate"),
            ("results/cpu/async_pp/curves.csv", "async_pp_aggregate"),
            ("results/cpu/sft_rl/aggregate.csv", "sft_rl_aggregate"),  # downstream of a checkpoint
            ("results/cpu/bench/async_pp.json", "async_pp_bench"),
            ("results/cpu/local/data/enwik8/train.bin", "local_data"),
            ("results/cpu/local/aggregate.csv", "local_aggregate"),
            ("results/cpu/runs/local.csv", "runs_table"),
            ("paper_tables/cpu/claims.csv", "verify")]
    summary = "output_file\tdate\trule\tlog-file(s)\tstatus\tplan\n" + "".join(
        f"{out}\tSat Dec  5 10:00:00 2026\t{rule}\t-\tok\tno update\n" for out, rule in rows)
    monkeypatch.setattr(rebuild, "snakemake", lambda work, args, *a, **k: subprocess.CompletedProcess(
        args, 0, stdout=summary if "--summary" in args else dry, stderr=""))
    checkpoints, others, training = rebuild.forced_outputs(tmp_path, "cpu", {"local"})
    assert training == {"async_pp_train", "async_pp_bench", "local_data"}
    assert checkpoints == ["results/cpu/async_pp/lr_rounds/round0.json"]
    assert others == ["paper_tables/cpu/claims.csv", "results/cpu/async_pp/curves.csv",
                      "results/cpu/async_pp/runs.csv", "results/cpu/sft_rl/aggregate.csv"]
    assert rebuild.is_record_or_data("results/cpu/sft_rl/m/base/seed0/replay/metrics.json", "cpu")


def test_check_rebuild_leaves_out_what_reads_a_study_with_missing_runs(monkeypatch, tmp_path, capsys):
    """Round 6: with study B's grid not yet run, B's own outputs were left out but the shared targets (power table,
    claims) still asked for B's claims, so the rebuild's dry run planned B's training and refused. Now every
    Snakemake call carries --omit-from with the missing records (Snakemake drops them and everything downstream),
    the shared outputs that reads are named as left out, and the other studies' outputs are still forced."""
    import subprocess

    import gradfidelity.rebuild as rebuild

    missing = "results/cpu/async_pp/c/seed100/metrics.json"
    full = [("results/cpu/async_pp/c/seed100/metrics.json", "async_pp_train"),
            ("results/cpu/async_pp/runs.csv", "async_pp_aggregate"),
            ("results/cpu/local/aggregate.csv", "local_aggregate"),
            ("paper_tables/cpu/power.md", "power"),
            ("paper_tables/cpu/claims.csv", "verify")]
    omitted = [row for row in full if row[1] in ("async_pp_train", "local_aggregate")]  # B's record stays upstream

    def table(rows):
        return "output_file\tdate\trule\tlog-file(s)\tstatus\tplan\n" + "".join(
            f"{out}\tSat Dec  5 10:00:00 2026\t{rule}\t-\tok\tno update\n" for out, rule in rows)

    calls, forcing = [], []

    def fake_snakemake(work, args, *a, **k):
        calls.append(args)
        out = (table(omitted if "--omit-from" in args else full) if "--summary" in args else "")
        return subprocess.CompletedProcess(args, 0, stdout=out, stderr="")

    monkeypatch.setattr(rebuild, "snakemake", fake_snakemake)
    monkeypatch.setattr(rebuild, "missing_runs", lambda repo, scale, study: [missing] if study == "async_pp" else [])
    monkeypatch.setattr(rebuild.subprocess, "run", lambda cmd, **k: forcing.append(cmd) or subprocess.CompletedProcess(
        cmd, 0, stdout="", stderr=""))
    rebuild.check_rebuild(tmp_path)
    printed = capsys.readouterr().out
    assert "async_pp left out: 1 of its planned runs have no committed record" in printed
    assert "2 more outputs left out, downstream of those runs: paper_tables/cpu/claims.csv, paper_tables/cpu/power.md" \
        in printed
    omitting = [args for args in calls if "--omit-from" in args]
    assert omitting and all(args[args.index("--omit-from") + 1] == missing for args in omitting)
    assert [args for args in calls if "--summary" not in args and "--omit-from" not in args] == []  # every dry run
    assert forcing and "--omit-from" in forcing[0] and missing in forcing[0]
    forced = forcing[0][forcing[0].index("--forcerun") + 1:forcing[0].index("--", forcing[0].index("--forcerun"))]
    assert forced == ["results/cpu/local/aggregate.csv"]  # not B's, not the shared outputs


def test_check_rebuild_refuses_a_training_job_before_forcing_anything(monkeypatch, tmp_path):
    """Issue 56: in a clone whose venv path differed, Snakemake found "Params have changed" on a forced cell and the
    rebuild retrained it. Now the rebuild's own command is dry-run first: a planned training job stops it, named
    with Snakemake's reason, and no forcing call runs. A dry run of analysis jobs only lets it go on."""
    import subprocess

    import gradfidelity.rebuild as rebuild
    from gradfidelity.errors import UserError

    summary = "output_file\tdate\trule\tlog-file(s)\tstatus\tplan\n" + "".join(
        f"{out}\tSat Dec  5 10:00:00 2026\t{rule}\t-\tok\tno update\n" for out, rule in [
            ("results/cpu/async_pp/c/seed0/metrics.json", "async_pp_train"),
            ("results/cpu/async_pp/runs.csv", "async_pp_aggregate")])
    retrains = """rule async_pp_aggregate:
    input: results/cpu/async_pp/c/seed0/metrics.json
    output: results/cpu/async_pp/runs.csv
    jobid: 1
    reason: Forced execution
rule async_pp_train:
    output: results/cpu/async_pp/c/seed0/metrics.json
    jobid: 2
    reason: Params have changed since last execution
"""
    analysis_only = retrains.split("rule async_pp_train")[0]
    forcing = []

    def fake_snakemake(work, args, *a, **k):
        out = summary if "--summary" in args else (dry if "--forcerun" in args else "")
        return subprocess.CompletedProcess(args, 0, stdout=out, stderr="")

    monkeypatch.setattr(rebuild, "snakemake", fake_snakemake)
    monkeypatch.setattr(rebuild, "missing_runs", lambda *a: [])
    monkeypatch.setattr(rebuild.subprocess, "run", lambda cmd, **k: forcing.append(cmd) or subprocess.CompletedProcess(
        cmd, 0, stdout="", stderr=""))
    dry = retrains
    with pytest.raises(UserError) as err:
        rebuild.check_rebuild(tmp_path)
    assert forcing == []  # nothing forced
    text = str(err.value)
    assert "would run 1 training job(s); nothing was forced" in text
    assert "rule async_pp_train: results/cpu/async_pp/c/seed0/metrics.json (reason: Params have changed" in text
    dry = analysis_only
    rebuild.check_rebuild(tmp_path)
    assert forcing and "--forcerun" in forcing[0]  # the analysis pass went ahead
    assert rebuild.training_jobs(analysis_only, {"async_pp_train"}, "cpu") == []
    data_job = "rule prep:\n    output: results/cpu/local/data/enwik8/train.bin\n"
    assert [j.rule for j in rebuild.training_jobs(data_job, set(), "cpu")] == ["prep"]  # by its output too
