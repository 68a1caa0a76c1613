"""Model architectures as plain torch modules over the paged-KV attention interface."""
