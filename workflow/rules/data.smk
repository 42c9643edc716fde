# Data preparation: corpora written once to results/<scale>/<study>/data/ and read by the training rules.
# Study C's byte corpora (enwik8, TinyStories, or their embedded stand-ins) are prepared here. Study A's arithmetic
# task and study B's character corpus are generated in-process from a fixed seed by their packages (a few KB, no
# file to cache), so they have no rule of their own; the real FineWeb-Edu / LUFFY loaders run only at paper scale.


rule local_data:
    output:
        train=f"{RESULTS}/local/data/{{corpus}}/train.bin",
        val=f"{RESULTS}/local/data/{{corpus}}/val.bin",
        meta=f"{RESULTS}/local/data/{{corpus}}/meta.json",
    params:
        gf=GF,
        cfg=study_cfg("local", "corpora"),  # only the corpora: a training change must not redo the data
    log:
        f"{RESULTS}/logs/local/data_{{corpus}}.log",
    conda:
        CONDA_ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    shell:
        "{params.gf} local-data --cfg {params.cfg} --corpus {wildcards.corpus}"
        " --out $(dirname {output.meta}) > {log} 2>&1"
