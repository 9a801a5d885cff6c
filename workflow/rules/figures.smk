# figures: pass@k curves (the paper's Figure 2 layout), k-efficiency with bootstrap intervals, sweep heatmaps,
# training curves and training dynamics.


rule figures:
    input:
        table=rules.aggregate.output.table,
        k_efficiency=rules.aggregate.output.k_efficiency_by_k,
        train=[train_file(L.DONE, spec.task, spec.name) for spec in RUNS if spec.trains],
    output:
        figures=PIPELINE.figure_files(report),
        index=figure_index(),
    log:
        log_path("figures", "all"),
    benchmark:
        benchmark_path("figures", "all")
    conda:
        "../envs/report.yaml"
    threads: rule_threads("figures")
    resources:
        **rule_resources("figures"),
    params:
        job=job_hash("figures"),
    shell:
        node_command("figures")
