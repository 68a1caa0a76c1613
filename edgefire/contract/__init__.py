"""The wire contract: what the gateway, the nodes and the clients agree on.

Imports nothing heavy and nothing of either side (no torch, no engine, no gateway), so every
process may import it; tests/test_architecture.py holds it to that.
"""
