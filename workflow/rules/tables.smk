rule table:
    input:
        unpack(table_inputs),
    output:
        csv=report(
            at_scale(paths.TABLE_CSV),
            caption="../report/table.rst",
            category="{paper}",
            subcategory="{table}",
            labels={
                "paper": "{paper}",
                "table": "{table}",
                "kind": "table (CSV download)",
            },
        ),
        md=at_scale(paths.TABLE_MD),
        html=report(
            at_scale(paths.TABLE_HTML),
            caption="../report/table.rst",
            category="{paper}",
            subcategory="{table}",
            labels={"paper": "{paper}", "table": "{table}", "kind": "table"},
        ),
        curves=report(
            at_scale(paths.CURVES_PNG),
            caption="../report/curves.rst",
            category="{paper}",
            subcategory="{table}",
            labels={"paper": "{paper}", "table": "{table}", "kind": "training curves"},
        ),
    log:
        log_for("table/{paper}/{table}"),
    conda:
        ENV
    params:
        cli=CLI,
        seeds=paper_seeds,
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} --seeds {params.seeds} table --paper {wildcards.paper} --table {wildcards.table} > {log} 2>&1'


rule ledger:
    input:
        unpack(ledger_inputs),
    output:
        md=at_scale(paths.LEDGER_MD),
        html=report(
            at_scale(paths.LEDGER_HTML),
            caption="../report/ledger.rst",
            category="{paper}",
            subcategory="ledger",
            labels={"paper": "{paper}", "kind": "reproduction ledger"},
        ),
        csv=report(
            at_scale(paths.LEDGER_CSV),
            caption="../report/ledger.rst",
            category="{paper}",
            subcategory="ledger",
            labels={"paper": "{paper}", "kind": "ledger (CSV download)"},
        ),
    log:
        log_for("ledger/{paper}"),
    conda:
        ENV
    params:
        cli=CLI,
        seeds=paper_seeds,
        claims=ledger_params,
        tables=ledger_tables,
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} --seeds {params.seeds} --tables {params.tables} ledger --paper {wildcards.paper} > {log} 2>&1'


rule figure:
    input:
        figure_table,
    output:
        report(
            at_scale(paths.FIGURE_PNG),
            caption="../report/figure.rst",
            category="{paper}",
            subcategory="figures",
            labels={"paper": "{paper}", "figure": "{figure}"},
        ),
    log:
        log_for("figure/{paper}/{figure}"),
    wildcard_constraints:
        figure=TABLE_FIGURES,
    conda:
        ENV
    params:
        cli=CLI,
        seeds=paper_seeds,
        fig=figure_params,
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} --seeds {params.seeds} figure --paper {wildcards.paper} --name {wildcards.figure} > {log} 2>&1'


rule token_credit_figure:
    input:
        token_credit_run,
    output:
        png=report(
            at_scale(paths.FIGURE_PNG),
            caption="../report/token_credit.rst",
            category="{paper}",
            subcategory="figures",
            labels={"paper": "{paper}", "figure": "{figure}"},
        ),
        md=at_scale(paths.FIGURE_MD),
        csv=at_scale(paths.FIGURE_CSV),
    log:
        log_for("figure/{paper}/{figure}"),
    wildcard_constraints:
        figure=TOKEN_CREDIT_FIGURES,
    conda:
        ENV
    params:
        cli=CLI,
        seeds=paper_seeds,
        fig=figure_params,
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} --seeds {params.seeds} figure --paper {wildcards.paper} --name {wildcards.figure} > {log} 2>&1'


rule diagnose:
    input:
        unpack(decode_inputs),
    output:
        report(
            at_scale(paths.DIAG_PNG),
            caption="../report/diagnostics.rst",
            category="diagnostics",
            labels={"backbone": "{backbone}", "run": "{run}", "seed": "{seed}"},
        ),
    log:
        log_for("diagnose/{backbone}/{run}/s{seed}"),
    conda:
        ENV
    threads: 1
    params:
        cli=CLI,
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} diagnose --backbone {wildcards.backbone} --run {wildcards.run} --seed {wildcards.seed} '
        "> {log} 2>&1"


for _paper, _table in PLAN.tables:

    rule:
        name:
            f"table_{_paper}_{_table}"
        default_target: False
        input:
            at_scale(paths.TABLE_CSV).format(paper=_paper, table=_table),
            at_scale(paths.CURVES_PNG).format(paper=_paper, table=_table),
