"""Real runs under torchrun: what one rank does, the launcher's process plumbing, their results."""
