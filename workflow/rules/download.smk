# Hub downloads, once, on the submit host (localrules in the Snakefile): the initial policy (and a
# separate representation model) given as Hugging Face ids, and the datasets of `source: hf`.
# GPU and CPU jobs then read these local copies only (HF_HUB_OFFLINE=1 in their environment).


rule download_model:
    output:
        directory(hub_model_dir()),
    log:
        log_path("download_model", "{hub_model}"),
    benchmark:
        benchmark_path("download_model", "{hub_model}")
    wildcard_constraints:
        hub_model=HUB_MODEL_PATTERN,
    retries: 2  # transient network errors; a partial download resumes from the Hub cache
    conda:
        "../envs/hf.yaml"
    threads: rule_threads("download_model")
    resources:
        **rule_resources("download_model"),
    params:
        repo_id=hub_repo_id,
    shell:
        'repexp mlflow node --config "$REPEXP_CONFIG" --rule download_model --snakemake-jobid {{{jobid}}}'
        " --wildcard hub_model={wildcards.hub_model} --attempt {resources.attempt} --output {output} --"
        " repexp download model {params.repo_id} --out {output} > {log} 2>&1"


rule download_data:
    output:
        hub_data_files(),
    log:
        log_path("download_data", "all"),
    benchmark:
        benchmark_path("download_data", "all")
    retries: 2
    conda:
        "../envs/core.yaml"
    threads: rule_threads("download_data")
    resources:
        **rule_resources("download_data"),
    params:
        flags=download_data_flags,
    shell:
        'repexp mlflow node --config "$REPEXP_CONFIG" --rule download_data --snakemake-jobid {{{jobid}}}'
        " --attempt {resources.attempt} --output {output} --"
        " repexp download data {params.flags} > {log} 2>&1"
