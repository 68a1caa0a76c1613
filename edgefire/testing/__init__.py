"""Testing code that calls Workers AI against edgefire: the pytest plugin and its fleet."""
