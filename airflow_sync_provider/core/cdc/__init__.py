"""Change data capture: binlog positions and versions, the apply lanes' hash ring, binlog
events → target rows, and the pipeline's checkpoints (plain Python: no Airflow, no Spark)."""
