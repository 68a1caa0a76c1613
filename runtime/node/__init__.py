"""The edge node: its city, settings, model registry (lazy load, LRU) and serving handles."""
