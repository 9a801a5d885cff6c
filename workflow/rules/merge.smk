# merge (verl only): FSDP actor shards of the selected checkpoint -> a Hugging Face directory.


rule merge:
    input:
        pointer=train_file(L.SELECT),
    output:
        merged=train_file(L.MERGED),
    log:
        log_path("merge", "{task}", "{run}"),
    benchmark:
        benchmark_path("merge", "{task}", "{run}")
    wildcard_constraints:
        run=VERL_RUN_PATTERN,
    retries: 1  # large checkpoints on shared filesystems: a transient I/O error can pass on retry
    conda:
        "../envs/train.yaml"
    threads: rule_threads("merge")
    resources:
        **rule_resources("merge"),
    shell:
        node_command("merge")
