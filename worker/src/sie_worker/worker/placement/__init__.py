"""Where models go: the pure allocator and what it reads."""
