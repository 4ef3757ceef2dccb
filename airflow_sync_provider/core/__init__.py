"""The core: planning, type mapping, SQL quoting, job specs. Imports neither Airflow nor pyspark."""
