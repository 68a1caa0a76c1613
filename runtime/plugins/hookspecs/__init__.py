"""Hook specifications, one module per extension domain."""

from runtime.plugins.hookspecs import codecs, kv, models, parallel, providers

ALL = (models, kv, parallel, codecs, providers)
