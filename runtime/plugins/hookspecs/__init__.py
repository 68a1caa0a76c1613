"""The node's hook specifications, one module per extension domain."""

from edgefire.runtime.plugins.hookspecs import codecs, exporters, kv, models, parallel

ALL = (models, kv, parallel, codecs, exporters)
