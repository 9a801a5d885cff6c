# aggregate: every evaluation -> one tidy pass@k table (+ k-efficiency with bootstrap intervals, also per
# reference k for the figure, markdown/HTML views, the registered analysis of docs/pilot.md's fourth design);
# also logs pass@1/16/256 on each sweep point's MLflow parent run.


rule aggregate:
    input:
        evals=all_eval_files(),
        testtime=all_testtime_files(),
    output:
        table=aggregate_file(L.PASS_AT_K_CSV),
        k_efficiency=report(
            aggregate_file(L.K_EFFICIENCY_CSV),
            caption="../report/k_efficiency.rst",
            category="Results",
            subcategory="Tables",
            labels={"table": "k-efficiency"},
        ),
        k_efficiency_by_k=aggregate_file(L.K_EFFICIENCY_BY_K_CSV),
        markdown=aggregate_file(L.PASS_AT_K_MD),
        preregistered=aggregate_file(L.PREREGISTERED_MD),
        preregistered_json=aggregate_file(L.PREREGISTERED_JSON),
        html=report(
            aggregate_file(L.PASS_AT_K_HTML),
            caption="../report/pass_at_k_table.rst",
            category="Results",
            subcategory="Tables",
            labels={"table": "pass@k"},
        ),
    log:
        log_path("aggregate", "all"),
    benchmark:
        benchmark_path("aggregate", "all")
    conda:
        "../envs/report.yaml"
    threads: rule_threads("aggregate")
    resources:
        **rule_resources("aggregate"),
    params:
        job=job_hash("aggregate"),
    shell:
        node_command("aggregate")
