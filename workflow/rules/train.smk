# train(task, method with its parameters, backend, seed): every run of sweep.methods (repexp.methods.METHODS).
# `repexp run train` composes the job's config, writes job.yaml, opens the MLflow node run and runs
# the backend trainer, which resumes from its latest complete checkpoint on a retry (repexp.train).


rule train:
    input:
        unpack(train_inputs),
    output:
        done=train_file(L.DONE),
    log:
        log_path("train", "{task}", "{run}"),
    benchmark:
        benchmark_path("train", "{task}", "{run}")
    wildcard_constraints:
        run=TRAINED_RUN_PATTERN,
    # failures (a crash, a node lost, a walltime kill) retry and resume from the newest checkpoint; a
    # walltime chunk's end and a preemption requeue the SLURM job instead (repexp.walltime)
    retries: C.TRAIN_RETRIES
    conda:
        "../envs/train.yaml"
    threads: rule_threads("train")
    resources:
        **rule_resources("train"),
    params:
        job=job_hash("train"),  # the training hash: eval, tracking and runtime settings rerun no training
    shell:
        'bash "$REPEXP_WORKFLOW_DIR/scripts/ray_slurm.sh" {resources.nodes} {resources.gpus_per_node} {threads} '
        + node_command("train")
