"""check-reference: rerun a sample of the committed cpu runs and judge every metric, record and verdict.

check.py     the comparison policy per metric and record, exit codes (0/1/2/3/4), the summary line, the command
sample.py    which runs, by a fixed rule (or sized to a budget), from the dry-run plan
schedule.py  the speed probes, the expected time, one Snakemake call per study (drift-only studies first)
rerun.py     the scratch copy, one Snakemake call that a failure, the budget or Ctrl-C ends without losing a run
seeds.py     a chaotic metric across host types: one more seed, cannot fail, a reading, another base
dag.py       the dry-run plan's jobs and closures
drift.py     --measure-drift: the sample rerun at two ISA levels of one host
verdicts.py  each sampled study's claims recomputed with the rerun values in place of the committed ones

The record comparison primitives (RECORD, record_digest, compare, the cross-host rules) live in
harness/record_compare.py: harness/ and claims/ import them from there, never from here.
"""
