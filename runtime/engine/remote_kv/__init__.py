"""KV pages beyond the node's own pool: their record format, the store contract, the tier."""
