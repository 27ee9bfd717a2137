rule warmup:
    input:
        data=at_scale(paths.DATA_DONE),
        tracking=rules.init_tracking.output,
    output:
        at_scale(paths.BASE_DONE),
    log:
        log_for("warmup/{backbone}"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=2000,
    params:
        cli=CLI,
    shell:
        "{params.cli} warmup --backbone {wildcards.backbone} > {log} 2>&1"


rule train:
    input:
        base=at_scale(paths.BASE_DONE),
        tracking=rules.init_tracking.output,
    output:
        done=at_scale(paths.RUN_DONE),
        metrics=at_scale(paths.RUN_METRICS),
    log:
        log_for("train/{backbone}/{run}/s{seed}"),
    conda:
        ENV
    threads: train_threads  # smoke: the verl job's ranks (a Ray cluster each); else 1
    resources:
        mem_mb=3000,
        nodes=train_nodes,  # per run (model.verl at paper scale): the SLURM profile leaves these to the rule
        gpu=train_gpus,
    params:
        cli=CLI,
    shell:
        "{params.cli} train --backbone {wildcards.backbone} --run {wildcards.run} --seed {wildcards.seed} > {log} 2>&1"
