# preprocess(task): seeded train/dev/test parquet splits in verl's row format.


rule preprocess:
    input:
        preprocess_inputs,  # the hub tables (download_data) when data.source or data.dapo_source is hf
    output:
        train=data_file("train"),
        dev=data_file("dev"),
        test=data_file("test"),
        manifest=manifest_file(),
    log:
        log_path("preprocess", "{task}"),
    benchmark:
        benchmark_path("preprocess", "{task}")
    conda:
        "../envs/core.yaml"
    threads: rule_threads("preprocess")
    resources:
        **rule_resources("preprocess"),
    params:
        flags=preprocess_flags,
    shell:
        'repexp mlflow node --config "$REPEXP_CONFIG" --rule preprocess --snakemake-jobid {{{jobid}}} --task {wildcards.task}'
        " --attempt {resources.attempt} --output {output} --"
        " repexp data prepare {wildcards.task} --out $(dirname {output.manifest}) {params.flags}"
        " > {log} 2>&1"
