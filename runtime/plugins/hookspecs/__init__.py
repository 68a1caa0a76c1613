"""Hook specifications, one module per extension domain."""

from edgefire.runtime.plugins.hookspecs import codecs, exporters, kv, models, parallel, providers

ALL = (models, kv, parallel, codecs, providers, exporters)
