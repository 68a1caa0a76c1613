"""The dashboard: static pages (static/) that read the gateway's public API routes."""
