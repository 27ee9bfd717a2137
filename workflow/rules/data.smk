rule init_tracking:
    output:
        paths.TRACKING_READY.replace("{results}", RESULTS),
    log:
        log_for("init_tracking"),
    conda:
        ENV
    params:
        cli=CLI,
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} init-tracking > {log} 2>&1'


rule prepare_data:
    output:
        at_scale(paths.DATA_DONE),
    log:
        log_for("prepare_data"),
    conda:
        ENV
    params:
        cli=CLI,
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} prepare > {log} 2>&1'
