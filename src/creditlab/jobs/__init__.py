"""The jobs behind the ``python -m creditlab`` verbs, one module per job family.

``creditlab.cli`` parses arguments and calls them. prepare (the data), warmup (a backbone's base model), train,
evaluate (plain and with a test-time decoding), diagnose (token diagnostics), analyze (a paper's declared analyses),
tables (tables, ledgers, figures), tracking (the MLflow store and its UI), show (the plan, a run's config); common:
what they share. Run-level jobs take the plan (:func:`creditlab.plan.build_plan`) and a run's (backbone, run name,
seed).
"""
