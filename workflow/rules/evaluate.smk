rule evaluate:
    input:
        model=model_of,
        tracking=rules.init_tracking.output,
    output:
        at_scale(paths.EVAL_METRICS),
    log:
        log_for("evaluate/{backbone}/{run}/s{seed}"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=3000,
        gpu=eval_gpus,  # per run (eval.vllm tensor parallelism at paper scale): the SLURM profile leaves it to the rule
        runtime=eval_runtime,  # minutes: the job's estimate within the site's longest job (paper), else 240
    params:
        cli=CLI,
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} evaluate --backbone {wildcards.backbone} --run {wildcards.run} --seed {wildcards.seed} > {log} 2>&1'


rule evaluate_decode:
    input:
        unpack(decode_inputs),
        tracking=rules.init_tracking.output,
    output:
        at_scale(paths.DECODE_EVAL_METRICS),
    log:
        log_for("evaluate/{backbone}/{run}/s{seed}/decode-{decode}"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=3000,
        gpu=eval_gpus,  # per run (eval.vllm tensor parallelism at paper scale): the SLURM profile leaves it to the rule
        runtime=decode_runtime,  # minutes: the decoding's estimate within the site's longest job (paper), else 480
    params:
        cli=CLI,
    shell:
        '"$CREDITLAB_PYTHON" {params.cli} evaluate --backbone {wildcards.backbone} --run {wildcards.run} --seed {wildcards.seed} '
        "--decode {wildcards.decode} > {log} 2>&1"
