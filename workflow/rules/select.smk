# select: the best-dev checkpoint of a finished training run (a model pointer JSON).


rule select:
    input:
        done=train_file(L.DONE),
    output:
        pointer=train_file(L.SELECT),
    log:
        log_path("select", "{task}", "{run}"),
    benchmark:
        benchmark_path("select", "{task}", "{run}")
    wildcard_constraints:
        run=TRAINED_RUN_PATTERN,
    conda:
        "../envs/core.yaml"
    threads: rule_threads("select")
    resources:
        **rule_resources("select"),
    shell:
        node_command("select")
