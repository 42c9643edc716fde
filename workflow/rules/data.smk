# Data preparation: corpora written once to results/<scale>/<study>/data/ and read by the training rules.
# Study C's byte corpora (enwik8, TinyStories, or their embedded stand-ins) are prepared here; study B's text-file
# corpus (its BPE and token splits) by async_pp_data in async_pp.smk, from the same Python-docs text at the cpu scale.
# Study A's arithmetic task and study B's smoke corpus are generated in-process from a fixed seed by their packages
# (a few KB, no file to cache); the real FineWeb-Edu / LUFFY loaders run only at paper scale.


# Study C's `source: file` corpora are inputs of the data rule (a changed file redoes the splits). The cpu scale's
# real-text stand-in is built from Debian's python3.11-doc (docs/sources.md, "Study C: the cpu scale's text").
LOCAL_PYDOCS = f"{RESULTS}/local/corpus/python-docs-3.11.txt"
LOCAL_PYDOCS_MD5 = "ffe3fd4a0f5469cba03458a8aed6d3b6"


# (one list for both corpora: a changed file also redoes the other corpus's splits, a second's work). Each path must
# exist or be made by a rule of this run (here: local_corpus_pydocs at this scale), else the workflow refuses it as
# it loads, naming the key and, for another scale's results/<scale>/ path, both scales (not a bare
# MissingInputException when the DAG is built).
LOCAL_FILE_SOURCES = study_module("local", "corpus_check").file_sources(
    config["local"]["corpora"], SCALE, produced={LOCAL_PYDOCS: "local_corpus_pydocs"}
)


rule local_corpus_pydocs:
    output:
        LOCAL_PYDOCS,
    params:
        gf=GF,
        md5=LOCAL_PYDOCS_MD5,
    log:
        f"{RESULTS}/local/logs/corpus_pydocs.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("local_corpus_pydocs"),
    shell:
        "{params.gf} local-corpus --root /usr/share/doc/python3.11/html/_sources --suffix .rst.txt"
        " --md5 {params.md5} --out {output} > {log} 2>&1"


rule local_data:
    input:
        LOCAL_FILE_SOURCES,
    output:
        train=f"{RESULTS}/local/data/{{corpus}}/train.bin",
        val=f"{RESULTS}/local/data/{{corpus}}/val.bin",
        meta=f"{RESULTS}/local/data/{{corpus}}/meta.json",
    params:
        gf=GF,
        cfg=study_module("local", "rules").data_cfg(config["local"]),  # only this corpus's entry of local.corpora
    log:
        f"{RESULTS}/local/logs/data_{{corpus}}.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **rule_resources("local_data"),
    shell:
        "{params.gf} local-data --cfg {params.cfg} --corpus {wildcards.corpus}"
        " --out $(dirname {output.meta}) > {log} 2>&1"
