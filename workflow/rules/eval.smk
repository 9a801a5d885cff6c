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
        model=eval_model_flag,
        flags=eval_flags,
    shell:
        'repexp mlflow node --config "$REPEXP_CONFIG" --rule eval --snakemake-jobid {{{jobid}}} --task {wildcards.task} --run {wildcards.run}'
        " --attempt {resources.attempt} --output {output} --"
        " repexp eval {params.model} --data {input.data} --out $(dirname {output.eval}) {params.flags}"
        " --overwrite --no-progress > {log} 2>&1"
