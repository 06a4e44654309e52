"""The bundled demo: a pipeline config and a sample of Debezium events modelled on the seeds."""
