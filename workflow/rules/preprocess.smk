# preprocess(task): seeded train/dev/test parquet splits in verl's row format.


rule preprocess:
    input:
        PIPELINE.hub_data_files(),  # the hub tables (download_data) when data.source or data.dapo_source is hf
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
        job=job_hash("preprocess"),  # its settings, hashed: a change reruns it (the shell names none)
    shell:
        node_command("preprocess")
