rule table:
    input:
        unpack(table_inputs),
    output:
        csv=report(
            at_scale(paths.TABLE_CSV),
            caption="../report/table.rst",
            category="{paper}",
            subcategory="{table}",
            labels={"paper": "{paper}", "table": "{table}", "kind": "table"},
        ),
        md=at_scale(paths.TABLE_MD),
        curves=report(
            at_scale(paths.CURVES_PNG),
            caption="../report/curves.rst",
            category="{paper}",
            subcategory="{table}",
            labels={"paper": "{paper}", "table": "{table}", "kind": "training curves"},
        ),
    log:
        log_for("table/{paper}/{table}"),
    params:
        cli=CLI,
    conda:
        ENV
    shell:
        "{params.cli} table --paper {wildcards.paper} --table {wildcards.table} > {log} 2>&1"


for _paper, _table in PLAN.tables:

    rule:
        name:
            f"table_{_paper}_{_table}"
        input:
            at_scale(paths.TABLE_CSV).format(paper=_paper, table=_table),
            at_scale(paths.CURVES_PNG).format(paper=_paper, table=_table),
        default_target: False
