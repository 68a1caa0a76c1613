"""The pluggy markers of the `edgefire` project; plugins import `hookimpl` from here."""

import pluggy

PROJECT = "edgefire"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
