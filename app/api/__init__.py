"""HTTP surface: thin routes that parse, authenticate, delegate and respond."""
