"""Code-execution verifier: run a generated Python solution against test cases in a sandbox.

One job per module (importing this package imports none of them):

* :mod:`~creditlab.rewards.code.cases` -- test cases (LiveCodeBench's format, :func:`parse_tests`),
  answer comparison by LiveCodeBench's rules (huge integers as digit text, special decimals never
  equal) and the verdict types; what the judging means.
* :mod:`~creditlab.rewards.code.extract` -- :func:`extract_code`, the program of a response (imports
  only :mod:`re`: data validation reads code blocks without the sandbox).
* :mod:`~creditlab.rewards.code.harness` -- the harness, a module file whose text runs inside the
  sandbox as its pid 1 and forks one confined child per test (standard library only).
* :mod:`~creditlab.rewards.code.sandbox` -- process isolation: the tier (bubblewrap, ``unshare``,
  plain process), its interpreter and uid, the command that starts the harness, teardown,
  :func:`sandbox_report`.
* :mod:`~creditlab.rewards.code.policy` -- whether the tier probed here may score code (refused: ``none``
  anywhere; at paper scale a tier weaker than bwrap, unless accepted in words) and the record that goes with every
  code result.
* :mod:`~creditlab.rewards.code.protocol` -- the parent's side of the harness protocol: nonce-checked
  answers under deadlines, validated and turned into verdicts.
* :mod:`~creditlab.rewards.code.runner` -- :func:`run_tests` (one solution, one sandbox) and
  :func:`verify_many` (many solutions on worker threads).
* :mod:`~creditlab.rewards.code.reward` -- the registered reward ``code_exec`` (and its
  ``REWARD_SPECS`` entry), imported by :mod:`creditlab.rewards`.

Trust model in one paragraph: generated code is hostile. Expected outputs never enter the sandbox;
the trusted parent sends one test *input* at a time to the harness, which returns the solution's raw
stdout (or JSON return value), and the parent compares. Every answer carries a per-run nonce the
solution cannot read, and is validated field by field; anything else is that solution's
``sandbox_error``. A solution can only make its own verdict worse, never fake a pass without
producing the right output (details: :mod:`~creditlab.rewards.code.protocol`,
:mod:`~creditlab.rewards.code.sandbox`).
"""
