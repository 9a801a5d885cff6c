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
        job=job_hash("download_model"),
    shell:
        node_command("download_model")


rule download_data:
    output:
        PIPELINE.hub_data_files(),
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
        job=job_hash("download_data"),
    shell:
        node_command("download_data")
