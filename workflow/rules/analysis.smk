# Post-hoc analyses of RL updates declared in the paper configs (`analyses:`): token flipping, coupling
# masking, Monte Carlo token values (creditlab.analysis; `python -m creditlab analyze`).


rule analysis:
    input:
        unpack(analysis_inputs),
    output:
        json=at_scale(paths.ANALYSIS_JSON),
        md=at_scale(paths.ANALYSIS_MD),
        html=report(
            at_scale(paths.ANALYSIS_HTML),
            caption="../report/analysis.rst",
            category="{paper}",
            subcategory="analyses",
            labels={"paper": "{paper}", "analysis": "{analysis}", "kind": "results"},
        ),
        png=report(
            at_scale(paths.ANALYSIS_PNG),
            caption="../report/analysis.rst",
            category="{paper}",
            subcategory="analyses",
            labels={"paper": "{paper}", "analysis": "{analysis}", "kind": "figure"},
        ),
    log:
        log_for("analysis/{paper}/{analysis}"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=3000,
    params:
        cli=CLI,
        seeds=paper_seeds,
        spec=analysis_params,
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} --seeds {params.seeds} analyze --paper {wildcards.paper} --name {wildcards.analysis} > {log} 2>&1'
