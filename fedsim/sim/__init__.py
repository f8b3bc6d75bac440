"""The SimPy engine: a server process, device processes, and the timing model."""
