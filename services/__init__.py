"""shardlog services: one package per service, named after what it is."""
