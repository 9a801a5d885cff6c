# figures: pass@k curves (the paper's Figure 2 layout), k-efficiency with bootstrap intervals, sweep heatmaps,
# training curves and training dynamics.


rule figures:
    input:
        table=rules.aggregate.output.table,
        k_efficiency=rules.aggregate.output.k_efficiency_by_k,
        train=all_train_markers(),
    output:
        figures=figure_files(),
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
        curves=training_curve_flags,
    shell:
        'repexp mlflow node --config "$REPEXP_CONFIG" --rule figures --snakemake-jobid {{{jobid}}} --attempt {resources.attempt} --output {output} --'
        ' repexp figures --table {input.table} --k-efficiency {input.k_efficiency} --out-dir $(dirname {output.index}) --config "$REPEXP_CONFIG"'
        " {params.curves} > {log} 2>&1"
