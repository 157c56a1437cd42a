"""Lower bounds and the search over configurations."""
