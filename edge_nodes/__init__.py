"""Edge nodes: one YAML per city and the `edge-node` command that serves a city's runtime."""
