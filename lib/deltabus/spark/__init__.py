"""Spark integration. Importing this package never starts a SparkSession."""
