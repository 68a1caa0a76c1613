"""Built-in node plugins: model architectures, KV backends, weight codecs, exporters."""
