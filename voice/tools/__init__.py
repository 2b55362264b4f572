"""Tools: what the session runs when the model calls it (the tool loop, the built-ins, MCP servers); the model only
writes the calls."""
