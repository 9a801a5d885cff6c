# Offline policies for `model: tiny|smollm2` (a hub id or a local directory needs no rule).


rule model:
    output:
        directory(alias_model_dir()),
    log:
        log_path("model", "{alias}"),
    benchmark:
        benchmark_path("model", "{alias}")
    conda:
        "../envs/hf.yaml"
    threads: rule_threads("model")
    resources:
        **rule_resources("model"),
    shell:
        'repexp mlflow node --config "$REPEXP_CONFIG" --rule model --snakemake-jobid {{{jobid}}} --wildcard alias={wildcards.alias}'
        " --attempt {resources.attempt} --output {output} --"
        " repexp model {wildcards.alias} --out {output} > {log} 2>&1"
