"""Nearest-healthy-node routing: client geolocation, the node directory and candidate ranking."""
