"""I/O around the core: the Kafka source, the Spark session factory and the Delta writers."""
