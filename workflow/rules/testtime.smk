# testtime: the paper's inference-time exploration on every evaluated run's stored samples. The
# samples are taken in RepExp order (features of the frozen initial policy) and compared with a random
# order of the same samples: pass@k of both, verifier efficiency, samples-to-correct.


rule testtime:
    input:
        eval=eval_file(),
        model=model_dir(),
    output:
        result=testtime_file(),
    log:
        log_path("testtime", "{task}", "{run}"),
    benchmark:
        benchmark_path("testtime", "{task}", "{run}")
    retries: 1  # resumes from its cached feature shards
    conda:
        "../envs/eval.yaml"
    threads: rule_threads("testtime")
    resources:
        **rule_resources("testtime"),
    params:
        job=job_hash("testtime"),  # its settings, hashed: a change reruns it (the shell names none)
    shell:
        node_command("testtime")
