# figures: pass@k curves (the paper's Figure 2 layout), sweep heatmaps and training curves.


rule figures:
    input:
        table=rules.aggregate.output.table,
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
        ' repexp figures --table {input.table} --out-dir $(dirname {output.index}) --config "$REPEXP_CONFIG"'
        " {params.curves} > {log} 2>&1"
