"""Building libproteus.so and setting it up for an app (and, later, rewriting ELF files)."""
