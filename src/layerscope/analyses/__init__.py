"""Pure functions of a Trace."""
