# gradfidelity: one DAG from data to claims verdicts for three papers on bent gradients.
#   snakemake -c2                               the smoke scale (default), everything
#   snakemake -c2 --config scale=cpu            the cpu (evidence) scale
#   snakemake -c2 paper_tables/smoke/claims.md  any single output, with what it needs
# Outputs of scale S live under results/S/, paper_tables/S/ and figures/S/.
# See README.md (targets per claim) and CONTRIBUTING.md (how a study plugs in).
from snakemake.utils import min_version

from gradfidelity.config import validate_section

min_version("9.0")


configfile: "config/config.yaml"


validate_section(config, "workflow/schemas/config.schema.yaml", "")


include: "workflow/rules/common.smk"
include: "workflow/rules/ds_audit.smk"
include: "workflow/rules/sft_rl.smk"
include: "workflow/rules/async_pp.smk"
include: "workflow/rules/local.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/report.smk"


check_cluster_resources()


onstart:
    check_slurm_account()


# The HTML report opens on this page (scale, machine, git sha, verdict counts, the claims figure, links per study).
report: REPORT_SUMMARY


localrules:
    all,


rule all:
    input:
        f"{TABLES}/claims.md",
        f"{FIGURES}/claims.png",
        REPORT_SUMMARY,
        REPORT_TARGETS,
        RUNS_TABLES,
    default_target: True
