"""The gateway: accounts, AI Gateway features, providers and nearest-node routing."""
