"""Built-in plugins: KV backends, parallel strategies, weight codecs, providers."""
