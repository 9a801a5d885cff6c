# eval(test split): n samples per problem, unbiased pass@k. Trained runs load their model
# pointer (merged for verl); `base` evaluates the untrained policy.


rule eval:
    input:
        unpack(eval_inputs),
    output:
        eval=eval_file(),
    log:
        log_path("eval", "{task}", "{run}"),
    benchmark:
        benchmark_path("eval", "{task}", "{run}")
    retries: 1  # resumes from its complete sample shards
    conda:
        "../envs/eval.yaml"
    threads: rule_threads("eval")
    resources:
        **rule_resources("eval"),
    params:
        job=job_hash("eval"),  # its settings, hashed: a change reruns it (the shell names none)
    shell:
        node_command("eval")
