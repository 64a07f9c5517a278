"""Real serving stacks (llama.cpp's llama-server) run on loopback for the adapter tests and fixtures."""
