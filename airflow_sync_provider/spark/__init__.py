"""The Spark layer: functions that take a job spec and a SparkSession. No Airflow imports."""
