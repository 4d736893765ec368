"""Operations: the `pvm` CLI, the demo, replay, failed jobs, dead letters and the Prometheus exporter."""
