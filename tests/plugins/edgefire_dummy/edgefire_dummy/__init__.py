"""A third-party plugin distribution with a plugin for each world: `edgefire_dummy.node`
(entry-point group `edgefire.node`, torch) and `edgefire_dummy.gateway` (`edgefire.gateway`,
no torch). This package imports neither, so loading one world never loads the other."""
