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
    params:
        job=job_hash("model"),
    shell:
        node_command("model")
