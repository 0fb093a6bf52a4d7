"""Example pipelines (TOML) and the Dagster code location that loads them."""
