"""``python -m engine gpu-check --out DIR``: everything a task lent a GPU should measure, in
one command under a time budget. Each part is a command of the project (the ``gpu`` tests,
``kernels.bench``, ``benchmarks/bench_engine.py``, the decode profile, ``sim calibrate`` and
``validate``, the engine twice against itself) run in a process of its own, so that a broken
CUDA context or a leak in one cannot reach the next; each writes into ``DIR/<part>/``, and
``DIR/summary.md`` and ``summary.json`` say what each did and measured.

``parts`` states the parts, ``run`` runs them (budget, timeouts, ``--dry-run``), ``figures``
reads what each measured, ``summary`` writes the summary, ``environment`` is the first part."""
