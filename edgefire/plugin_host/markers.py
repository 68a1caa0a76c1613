"""The pluggy markers of the `edgefire` project, shared by the node and the gateway plugins.

Plugins import `hookimpl` through their world (`edgefire.runtime.plugins` for a node plugin,
`edgefire.gateway.plugins` for a gateway plugin); both are this one marker.
"""

import pluggy

PROJECT = "edgefire"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
