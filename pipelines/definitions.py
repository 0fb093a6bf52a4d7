"""Dagster code location for the example pipelines (the Dagster integration issue fills it in).

Loading it starts no Spark session and opens no database connection.
"""

import dagster as dg

defs = dg.Definitions()
