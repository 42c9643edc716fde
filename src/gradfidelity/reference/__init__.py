"""check-reference: rerun a sample of the committed cpu runs and judge every metric, record and verdict.

check.py    the sample, the comparison per metric and record, exit codes and the summary line
dag.py      the dry-run plan the sample is cut from
drift.py    --measure-drift: the sample rerun at two ISA levels of one host
verdicts.py each sampled study's claims recomputed with the rerun values in place of the committed ones
"""
