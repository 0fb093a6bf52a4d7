"""Reading the pipeline's SQL without running it (sqlglot, Spark dialect as Spark 4 runs it, ANSI on).

This package sits below ``spec``: the spec layer calls it while a pipeline loads, before any Spark
exists, so it imports only sqlglot, the standard library, the errors and the engine's column names,
never ``spark`` or ``streaming``. :mod:`.parsing` holds what every reader of the SQL shares (the
dialect, parsing one statement, where in the query a node sits); :mod:`.release` reads
``WATERMARK_TS()`` filters into a release plan (docs/contract/row-pipelines.md). ``spark.plans.safe_sql`` builds on
:mod:`.parsing` to guard the SQL at run time.
"""
